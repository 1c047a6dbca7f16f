//! Integration tests, one binary: real redb files in temp dirs, real sockets on 127.0.0.1 ephemeral ports, real
//! `raftq serve` processes where a test is about processes dying.

mod api;
mod auth;
mod backup;
mod cli;
mod cluster;
mod console;
mod crash;
mod failover;
mod fairness;
mod http2;
mod jobs;
mod jobs_cluster;
mod key_limits;
mod keyed;
mod limits;
mod metrics;
mod openapi;
mod procs;
mod rates;
mod replication;
mod rest;
mod revoke;
mod sdk;
mod stream;
mod support;
mod trace;
mod webhooks;
