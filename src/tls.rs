//! Optional TLS (rustls) for the public gRPC and HTTP ports and for Raft traffic, from PEM files.
//!
//! With `tls_cert_file` and `tls_key_file` every port of the node speaks TLS. `tls_ca_file` is the CA the node
//! verifies its peers with, both as a client (Raft calls, requests forwarded to the leader) and as the Raft
//! port's server: given a CA, the Raft port demands a client certificate signed by it (mutual TLS), on top of
//! the cluster credential. A node's certificate therefore needs both the serverAuth and clientAuth uses and
//! the names peers and clients dial it by.

use std::path::Path;
use std::sync::Arc;

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::config::Config;

pub struct Tls {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
}

fn read(what: &str, p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("{what} {}: {e}", p.display()))
}

impl Tls {
    /// The node's TLS settings, or `None` when it serves plain TCP.
    pub fn from_config(cfg: &Config) -> Result<Option<Arc<Tls>>, String> {
        let (cert, key) = match (&cfg.tls_cert_file, &cfg.tls_key_file) {
            (None, None) => {
                if cfg.tls_ca_file.is_some() {
                    return Err("tls_ca_file needs tls_cert_file and tls_key_file".into());
                }
                return Ok(None);
            }
            (Some(c), Some(k)) => (read("tls_cert_file", c)?, read("tls_key_file", k)?),
            _ => return Err("give both tls_cert_file and tls_key_file, or neither".into()),
        };
        let ca = cfg.tls_ca_file.as_deref().map(|p| read("tls_ca_file", p)).transpose()?;
        if ca.is_none() && cfg.peers.len() > 1 {
            return Err("a cluster with TLS needs tls_ca_file, to verify its peers".into());
        }
        let tls = Tls { cert, key, ca };
        // Fail at start, not at the first connection.
        tls.http_acceptor()?;
        Ok(Some(Arc::new(tls)))
    }

    fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert, &self.key)
    }

    /// The public gRPC port.
    pub fn public_server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new().identity(self.identity())
    }

    /// The Raft port: with a CA, peers must present a certificate it signed.
    pub fn raft_server(&self) -> ServerTlsConfig {
        let c = ServerTlsConfig::new().identity(self.identity());
        match &self.ca {
            Some(ca) => c.client_ca_root(Certificate::from_pem(ca)),
            None => c,
        }
    }

    /// Calls to peers and to the leader: verified with the CA, presenting this node's certificate.
    pub fn client(&self) -> ClientTlsConfig {
        let c = ClientTlsConfig::new().identity(self.identity());
        match &self.ca {
            Some(ca) => c.ca_certificate(Certificate::from_pem(ca)),
            None => c,
        }
    }

    /// The HTTP port's acceptor.
    pub fn http_acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, String> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("tls_cert_file: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| format!("tls_key_file: {e}"))?;
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut cfg = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| format!("tls_cert_file/tls_key_file: {e}"))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
    }
}

/// The URL for a peer's or leader's `host:port`: https when the node speaks TLS.
pub fn url(addr: &str, tls: bool) -> String {
    if addr.contains("://") {
        addr.to_string()
    } else if tls {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    }
}

/// Serves `router` over TLS on `listener` until `shutdown`: each connection is handshaken and served by
/// hyper (HTTP/1.1), on its own task.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    router: axum::Router,
    shutdown: tokio_util::sync::CancellationToken,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::service::TowerToHyperService;
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
        };
        let (acceptor, router, shutdown) = (acceptor.clone(), router.clone(), shutdown.clone());
        tokio::spawn(async move {
            let Ok(Ok(tls)) = tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp)).await
            else {
                return;
            };
            let service = TowerToHyperService::new(router);
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::select! {
                r = conn => if let Err(e) = r { tracing::debug!(error = %e, "https connection ended") },
                _ = shutdown.cancelled() => {}
            }
        });
    }
}
