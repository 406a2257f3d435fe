#!/usr/bin/env bash
# Runs the whole system in the foreground with an embedded NATS server (go tool task up).
# JAEGER=1 also runs Jaeger's all-in-one and sends the traces to it.
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
if [ "${JAEGER:-}" = 1 ]; then
  # Jaeger's all-in-one (deploy/jaeger), built once per version beside the Go build cache
  # as the tests do (minutes the first time: its dependency tree is large), on its usual ports.
  ver=$(awk '$1 == "github.com/jaegertracing/jaeger" {print $2}' deploy/jaeger/go.mod)
  jbin=$(go env GOCACHE)/lock-sensors/jaeger-$ver-$(go env GOOS)-$(go env GOARCH)/jaeger
  if [ ! -x "$jbin" ]; then
    echo "[up] building Jaeger $ver (once; minutes)" >&2
    mkdir -p "$(dirname "$jbin")"
    (cd deploy/jaeger && go build -o "$jbin.tmp" github.com/jaegertracing/jaeger/cmd/jaeger)
    mv "$jbin.tmp" "$jbin"
  fi
  "$jbin" --config deploy/jaeger/config.yaml &
  jaeger=$!
  trap 'kill "$jaeger" 2>/dev/null; wait "$jaeger" 2>/dev/null' EXIT
  export OTEL_EXPORTER_OTLP_ENDPOINT=${OTEL_EXPORTER_OTLP_ENDPOINT:-http://127.0.0.1:4318}
  echo "[up] traces: Jaeger's query API on http://${JAEGER_QUERY_HTTP:-127.0.0.1:16686}/api/traces?service=lock-sensors (OTLP to $OTEL_EXPORTER_OTLP_ENDPOINT)" >&2
  # Not exec: the shell stays to stop Jaeger when locks ends.
  "$bin" run --targets=all
  exit
fi
exec "$bin" run --targets=all
