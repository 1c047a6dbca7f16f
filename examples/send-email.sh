#!/bin/sh
# An example command for `raftq worker` (see README, "Workers and producers"): it "sends" the email in the
# task's payload by writing it to an outbox directory ($OUTBOX, default ./outbox), one file per task.
#
# The payload is the message: a `To:` line, then anything. What this prints on stdout is the task's result
# (exit 0 completes the task); a message on stderr and another exit status fail it, and the worker retries it
# while attempts remain. `raftq worker` sets RAFTQ_TASK_ID, RAFTQ_QUEUE, RAFTQ_ATTEMPT and RAFTQ_MAX_ATTEMPTS.
set -eu

outbox=${OUTBOX:-./outbox}
message=$(cat)
to=$(printf '%s\n' "$message" | sed -n 's/^To:[[:space:]]*//p' | head -n 1)
if [ -z "$to" ]; then
    echo "no To: line in the payload" >&2
    exit 1
fi
mkdir -p "$outbox"
printf '%s\n' "$message" > "$outbox/$RAFTQ_TASK_ID.eml"
echo "sent to $to (attempt $RAFTQ_ATTEMPT of $RAFTQ_MAX_ATTEMPTS)"
