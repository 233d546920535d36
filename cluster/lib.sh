# Shared settings of cluster/up.sh, down.sh and server.sh (sourced, not run).
#
# Everything lives under $CLUSTER_DIR (default: .cluster/ in the repository root, git-ignored):
# configuration generated from the templates in cluster/, data directories, logs, pid files and
# generated secrets (secrets/, mode 0700). Ports come from the environment (defaults below); the
# ports in use are recorded in $CLUSTER_DIR/env, which `source .cluster/env` loads in a shell.

set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER_DIR="${DMLBENCH_CLUSTER_DIR:-$REPO/.cluster}"
RUN="$CLUSTER_DIR/run"          # pid files, sockets
LOGS="$CLUSTER_DIR/logs"
SECRETS="$CLUSTER_DIR/secrets"

PG_PORT="${DMLBENCH_PG_PORT:-55432}"
MLFLOW_PORT="${DMLBENCH_MLFLOW_PORT:-5001}"
SLURMCTLD_PORT="${DMLBENCH_SLURMCTLD_PORT:-6817}"
SLURMD_PORT="${DMLBENCH_SLURMD_PORT:-6818}"
SLURMDBD_PORT="${DMLBENCH_SLURMDBD_PORT:-6819}"
MARIADB_PORT="${DMLBENCH_MARIADB_PORT:-53306}"
# slurmdbd (full `sacct`, needs MariaDB) or jobcomp (job-completion log only: `sacct --completion`)
ACCOUNTING="${DMLBENCH_SLURM_ACCOUNTING:-slurmdbd}"

PG_USER=dmlbench                # PostgreSQL role owning the databases below
PG_DATABASES="mlflow mlflow_auth optuna"
PG_SUPERUSER=postgres           # the OS user the PostgreSQL server runs as (it refuses root)

log() { printf 'cluster: %s\n' "$*"; }
die() { printf 'cluster: error: %s\n' "$*" >&2; exit 1; }

# the pid recorded in $RUN/$1.pid when that process is alive, else nothing
running_pid() {
    local file="$RUN/$1.pid" pid
    [[ -s "$file" ]] || return 1
    pid="$(head -n1 "$file" | tr -dc 0-9)"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# wait until TCP port $1 on 127.0.0.1 accepts connections (at most $2 seconds)
wait_port() {
    local port="$1" limit="$2" i
    for ((i = 0; i < limit * 5; i++)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.2
    done
    return 1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# a random secret in $SECRETS/$1, created once (hex: no characters that need quoting anywhere)
secret() {
    local file="$SECRETS/$1"
    if [[ ! -s "$file" ]]; then
        (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$file")
    fi
    cat "$file"
}

# the PostgreSQL 15 server binaries: on PATH (/usr/local/bin here) or Debian's /usr/lib/postgresql/*/bin
pg_bindir() {
    local initdb
    initdb="$(command -v initdb 2>/dev/null || true)"
    [[ -z "$initdb" ]] && initdb="$(ls -1 /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n1 || true)"
    [[ -n "$initdb" ]] && dirname "$(readlink -f "$initdb")"
}

as_postgres() { runuser -u "$PG_SUPERUSER" -- "$@"; }

# The name Slurm's compute nodes reach the MLflow server by: DMLBENCH_MLFLOW_PUBLIC_HOST, else this
# machine's fully qualified name.
mlflow_public_name() { echo "${DMLBENCH_MLFLOW_PUBLIC_HOST:-$(hostname -f 2>/dev/null || hostname)}"; }

# The MLflow server's addresses for `--host $1 --port $2`: "<this machine's> <the compute nodes'>",
# the second "-" when it listens on a loopback address only.
mlflow_addresses() {
    local host="$1" port="$2"
    case "$host" in
        127.* | localhost) echo "http://$host:$port -" ;;
        ::1 | "[::1]") echo "http://[::1]:$port -" ;;
        0.0.0.0 | :: | "[::]") echo "http://127.0.0.1:$port http://$(mlflow_public_name):$port" ;;
        *) echo "http://$host:$port http://${DMLBENCH_MLFLOW_PUBLIC_HOST:-$host}:$port" ;;
    esac
}
