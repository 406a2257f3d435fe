#!/usr/bin/env bash
# Runs the whole system in the foreground with an embedded NATS server (go tool task up).
# Uses LOCKS_API_TOKENS when set; otherwise a token kept in $LOCKS_DATA_DIR/api-token, made
# once, so that the API is usable at once and the token survives restarts.
set -euo pipefail
bin=${1:-./bin/locks}
data=${LOCKS_DATA_DIR:-./.locks}
mkdir -p "$data"
if [ -z "${LOCKS_API_TOKENS:-}" ]; then
  if [ ! -s "$data/api-token" ]; then
    (umask 077; head -c 24 /dev/urandom | base64 | tr '+/' '-_' >"$data/api-token")
  fi
  LOCKS_API_TOKENS=$(cat "$data/api-token")
  export LOCKS_API_TOKENS
fi
http=${LOCKS_HTTP_ADDR:-127.0.0.1:8080}
token=${LOCKS_API_TOKENS%%,*}
cat >&2 <<MSG
[up] API token: $token
[up] try:  curl -H 'Authorization: Bearer $token' http://$http/v1/sensors
[up] ready when http://$http/readyz answers 200; Ctrl-C stops everything.
MSG
exec "$bin" run --targets=all
