#!/usr/bin/env bash
# make server: the team tracking server on the local cluster's PostgreSQL (make cluster-up first):
#   mlflow server --backend-store-uri postgresql://dmlbench@127.0.0.1:$DMLBENCH_PG_PORT/mlflow
#                 --artifacts-destination <a shared directory, or s3://...> --app-name basic-auth
# in the background (pid in .cluster/run/mlflow.pid, log in .cluster/logs/mlflow.log); idempotent.
# https://mlflow.org/docs/latest/self-hosting/architecture/tracking-server
# https://mlflow.org/docs/latest/self-hosting/security/basic-http-auth
#
# Credentials never reach a command line, a committed file or the log:
#   - the database password: libpq's PGPASSFILE (.cluster/secrets/pgpass, written by up.sh);
#   - the basic-auth admin: MLFLOW_AUTH_ADMIN_USERNAME (default admin) and MLFLOW_AUTH_ADMIN_PASSWORD
#     from the environment; without it a random one is generated once into
#     .cluster/secrets/mlflow_admin_password (git-ignored, mode 0600). MLflow uses them only when
#     it creates its user store (the first start); later starts keep the stored password;
#   - MLFLOW_FLASK_SERVER_SECRET_KEY (basic-auth's CSRF key): from the environment or generated once.
# MLflow's job runner (GenAI jobs, a few worker processes) is off unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true.
# Settings: DMLBENCH_MLFLOW_PORT (5001), DMLBENCH_MLFLOW_HOST (127.0.0.1; 0.0.0.0 to serve other
# machines: Slurm's compute nodes), DMLBENCH_MLFLOW_PUBLIC_HOST (the name they reach it by; default
# hostname -f), DMLBENCH_MLFLOW_ALLOWED_HOSTS (the Host headers MLflow's security middleware accepts
# when serving others; default that name, localhost and private addresses), DMLBENCH_MLFLOW_ARTIFACTS
# (default .cluster/mlflow/artifacts; a shared file system path or s3://bucket/prefix),
# DMLBENCH_MLFLOW_WORKERS (2), MLFLOW_BIN (the venv's mlflow). It prints both addresses: this
# machine's, and the compute nodes' (the one `make repro EXECUTOR=slurm` needs: a loopback
# MLFLOW_TRACKING_URI is refused there, docs/cluster.md), which .cluster/env then exports.
#
# Without root and without the local cluster, on a site's existing PostgreSQL database:
#   make server DATABASE_URL=postgresql://<user>@<host>[:<port>]/<db>   (DMLBENCH_DATABASE_URL)
# MLflow's runs go to that database; its basic-auth users to DMLBENCH_AUTH_DATABASE_URL (default: an
# SQLite file in .cluster/mlflow/, on this machine's disk: only the server opens it). The password
# stays out of the URL: libpq reads it from PGPASSFILE (default ~/.pgpass, mode 0600;
# https://www.postgresql.org/docs/current/libpq-pgpass.html). State goes to $DMLBENCH_CLUSTER_DIR.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
START=$SECONDS
DATABASE_URL="${DMLBENCH_DATABASE_URL:-}"
if [[ -n "$DATABASE_URL" ]]; then
    [[ "$DATABASE_URL" == postgresql://* ]] || die "DATABASE_URL: expected postgresql://<user>@<host>/<db>, got ${DATABASE_URL%%://*}://..."
    rest="${DATABASE_URL#postgresql://}"
    [[ "$rest" != *@* || "${rest%%@*}" != *:* ]] || die "DATABASE_URL holds a password: put it in ~/.pgpass (or PGPASSFILE) instead"
    mkdir -p "$RUN" "$LOGS" "$CLUSTER_DIR/mlflow"
    (umask 077 && mkdir -p "$SECRETS")
    AUTH_DATABASE_URL="${DMLBENCH_AUTH_DATABASE_URL:-sqlite:///$CLUSTER_DIR/mlflow/basic_auth.db}"
    PGPASS="${PGPASSFILE:-$HOME/.pgpass}"
else
    [[ -f "$CLUSTER_DIR/env" ]] || die "the local cluster is not set up: run make cluster-up first (or make server DATABASE_URL=postgresql://user@host/db)"
    MLFLOW_PORT_WANTED="${DMLBENCH_MLFLOW_PORT:-}"
    source "$CLUSTER_DIR/env"  # the PostgreSQL port up.sh used (and its default MLflow port)
    MLFLOW_PORT="${MLFLOW_PORT_WANTED:-$DMLBENCH_MLFLOW_PORT}"
    PG_PORT="$DMLBENCH_PG_PORT"
    DATABASE_URL="postgresql://$PG_USER@127.0.0.1:$PG_PORT/mlflow"
    AUTH_DATABASE_URL="postgresql://$PG_USER@127.0.0.1:$PG_PORT/mlflow_auth"
    PGPASS="$SECRETS/pgpass"
fi
HOST="${DMLBENCH_MLFLOW_HOST:-127.0.0.1}"
ARTIFACTS="${DMLBENCH_MLFLOW_ARTIFACTS:-$CLUSTER_DIR/mlflow/artifacts}"
WORKERS="${DMLBENCH_MLFLOW_WORKERS:-2}"
MLFLOW_BIN="${MLFLOW_BIN:-$REPO/.venv/bin/mlflow}"
ADMIN="${MLFLOW_AUTH_ADMIN_USERNAME:-admin}"
read -r URL NODES_URL <<<"$(mlflow_addresses "$HOST" "$MLFLOW_PORT")"
SERVE_ARGS=()
if [[ "$NODES_URL" != - ]]; then  # MLflow's security middleware accepts only these Host headers
    public="${NODES_URL#http://}"
    public="${public%:*}"
    SERVE_ARGS=(--allowed-hosts "${DMLBENCH_MLFLOW_ALLOWED_HOSTS:-$public:*,${public%%.*}:*,localhost:*,127.0.0.1:*,10.*,172.*,192.168.*}")
fi

if pid="$(running_pid mlflow)"; then
    log "MLflow server already running (pid $pid) on $URL"
    exit 0
fi
[[ -x "$MLFLOW_BIN" ]] || die "no mlflow at $MLFLOW_BIN (make server installs it into the venv; or set MLFLOW_BIN)"
"${MLFLOW_BIN%/mlflow}/python" -c 'import psycopg, flask_wtf' 2>/dev/null ||
    die "the venv lacks the cluster extra (psycopg, Flask-WTF): run make server (it installs .[cluster])"
if [[ -z "${DMLBENCH_DATABASE_URL:-}" ]]; then
    port_open "$PG_PORT" || die "PostgreSQL is not listening on 127.0.0.1:$PG_PORT: run make cluster-up first"
    [[ -r "$SECRETS/pgpass" ]] || die "no $SECRETS/pgpass (written by make cluster-up)"
fi
port_open "$MLFLOW_PORT" && die "port $MLFLOW_PORT is in use by another process; set DMLBENCH_MLFLOW_PORT to a free port"

if [[ -n "${MLFLOW_AUTH_ADMIN_PASSWORD:-}" ]]; then
    PASSWORD="$MLFLOW_AUTH_ADMIN_PASSWORD"
else
    PASSWORD="$(secret mlflow_admin_password)"
fi
SECRET_KEY="${MLFLOW_FLASK_SERVER_SECRET_KEY:-$(secret flask_secret_key)}"

mkdir -p "$CLUSTER_DIR/mlflow"
[[ "$ARTIFACTS" == *://* ]] || mkdir -p "$ARTIFACTS"
sed -e "s|@AUTH_DATABASE_URL@|$AUTH_DATABASE_URL|g" "$REPO/cluster/basic_auth.ini.in" >"$CLUSTER_DIR/mlflow/basic_auth.ini"

log "starting the MLflow server on $URL (store ${DATABASE_URL}, artifacts: $ARTIFACTS, basic-auth)"
# its own session (setsid): cluster/down.sh stops it with its workers as one process group
(
    cd "$CLUSTER_DIR/mlflow"
    exec env -u MLFLOW_TRACKING_URI -u MLFLOW_TRACKING_USERNAME -u MLFLOW_TRACKING_PASSWORD \
        PGPASSFILE="$PGPASS" MLFLOW_AUTH_CONFIG_PATH="$CLUSTER_DIR/mlflow/basic_auth.ini" \
        MLFLOW_AUTH_ADMIN_USERNAME="$ADMIN" MLFLOW_AUTH_ADMIN_PASSWORD="$PASSWORD" \
        MLFLOW_FLASK_SERVER_SECRET_KEY="$SECRET_KEY" MLFLOW_DISABLE_TELEMETRY=true \
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}" \
        setsid "$MLFLOW_BIN" server --host "$HOST" --port "$MLFLOW_PORT" --workers "$WORKERS" \
        "${SERVE_ARGS[@]}" --backend-store-uri "$DATABASE_URL" \
        --artifacts-destination "$ARTIFACTS" --app-name basic-auth
) </dev/null >>"$LOGS/mlflow.log" 2>&1 &
echo $! >"$RUN/mlflow.pid"
# what clients and tests need to know of this server (.cluster/env sources it)
# (the compute nodes' address where it serves them: what Slurm jobs and this machine both reach)
cat >"$CLUSTER_DIR/mlflow/server.env" <<EOF
export MLFLOW_TRACKING_URI=$([[ "$NODES_URL" != - ]] && echo "$NODES_URL" || echo "$URL")
export DMLBENCH_MLFLOW_ARTIFACTS=$ARTIFACTS
export DMLBENCH_MLFLOW_LOG=$LOGS/mlflow.log
EOF

# up when an authenticated request answers (the first start creates MLflow's tables: ~20-40 s)
code=000
for ((i = 0; i < 600; i++)); do
    running_pid mlflow >/dev/null || die "the MLflow server exited: $(grep -v '^\s*$' "$LOGS/mlflow.log" | tail -n1 | cut -c1-200) (log: $LOGS/mlflow.log)"
    # credentials on curl's stdin (-K -), not on its command line
    code="$(printf 'user = "%s:%s"\n' "$ADMIN" "$PASSWORD" | curl -K - -s -o /dev/null -w '%{http_code}' \
        "$URL/api/2.0/mlflow/experiments/search?max_results=1" 2>/dev/null || true)"
    [[ "$code" == 200 || "$code" == 401 ]] && break
    sleep 0.2
done
case "$code" in
    200)
        log "MLflow server up in $((SECONDS - START)) s (pid $(cat "$RUN/mlflow.pid")), user $ADMIN (source $CLUSTER_DIR/env)"
        log "  this machine:   MLFLOW_TRACKING_URI=$URL"
        if [[ "$NODES_URL" != - ]]; then
            log "  compute nodes:  MLFLOW_TRACKING_URI=$NODES_URL (for make repro EXECUTOR=slurm)"
        else
            log "  compute nodes:  none (it listens on $HOST only; with DMLBENCH_MLFLOW_HOST=0.0.0.0 it serves them at http://$(mlflow_public_name):$MLFLOW_PORT)"
        fi ;;
    401) die "the server refuses user $ADMIN: its user store keeps the admin password of its first start (MLFLOW_AUTH_ADMIN_PASSWORD, or .cluster/secrets/mlflow_admin_password)" ;;
    *) die "the MLflow server did not answer within 120 s (HTTP $code; log: $LOGS/mlflow.log)" ;;
esac
