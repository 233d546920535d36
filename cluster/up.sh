#!/usr/bin/env bash
# make cluster-up: a single-node Slurm (munged, slurmctld, slurmd; slurmdbd + MariaDB for `sacct`)
# and a PostgreSQL cluster on 127.0.0.1, all under .cluster/ (docs/cluster.md). Installs the Debian
# packages it lacks. Idempotent: what already runs is left running. cluster/down.sh stops it.
#
# No systemd here: every daemon is started by hand, records its pid under .cluster/run/ and logs
# under .cluster/logs/. Slurm quick start: https://slurm.schedmd.com/quickstart_admin.html
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
START=$SECONDS

[[ $EUID -eq 0 ]] || die "run as root (it installs Debian packages and starts Slurm's daemons as root)"
[[ "$ACCOUNTING" == slurmdbd || "$ACCOUNTING" == jobcomp ]] ||
    die "DMLBENCH_SLURM_ACCOUNTING must be slurmdbd or jobcomp (got '$ACCOUNTING')"
NODE="$(hostname -s)"
SLURM_DIR="$CLUSTER_DIR/slurm"
export SLURM_CONF="$SLURM_DIR/slurm.conf"
MUNGE_DIR="$CLUSTER_DIR/munge"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket.2"
MARIADB_CNF="$CLUSTER_DIR/mariadb.cnf"
PG_DATA="$CLUSTER_DIR/postgres/data"
PG_SOCKET_DIR="$RUN/postgres"

# ---------------------------------------------------------------- Debian packages
install_packages() {
    local missing=() policy=/usr/sbin/policy-rc.d
    command -v munged >/dev/null || missing+=(munge)
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    if [[ "$ACCOUNTING" == slurmdbd ]]; then
        command -v slurmdbd >/dev/null || missing+=(slurmdbd slurm-wlm-mysql-plugin)
        # the server and client cores only: mariadb-server's scripts would also upgrade perl
        command -v mariadbd >/dev/null || missing+=(mariadb-server-core)
        command -v mariadb >/dev/null || missing+=(mariadb-client-core)
    fi
    [[ -n "$(pg_bindir)" ]] || missing+=(postgresql-15)
    command -v psql >/dev/null || missing+=(postgresql-client-15)
    ((${#missing[@]})) || return 0
    log "installing Debian packages: ${missing[*]} (about 10-30 s)"
    # keep the packages' init scripts from starting system-wide daemons on the default ports
    # (policy-rc.d exit status 101 = action forbidden: https://people.debian.org/~hmh/invokerc.d-policyrc.d-specification.txt)
    local own_policy=""
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && own_policy=1
    fi
    local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}")
    mkdir -p "$LOGS"
    if ! "${apt[@]}" >"$LOGS/apt.log" 2>&1; then
        log "apt-get install failed; updating the package lists and retrying"
        apt-get update -q >>"$LOGS/apt.log" 2>&1 || true
        "${apt[@]}" >>"$LOGS/apt.log" 2>&1 || { [[ -n "$own_policy" ]] && rm -f "$policy"; die "apt-get install ${missing[*]} failed: $(tail -n1 "$LOGS/apt.log") (log: $LOGS/apt.log)"; }
    fi
    [[ -n "$own_policy" ]] && rm -f "$policy"
    return 0
}

# fill @NAME@ placeholders of template $1 into $2 (values: paths, ports, hex secrets)
render() {
    local template="$1" out="$2" mode="${3:-644}" tmp
    tmp="$(mktemp "$out.XXXXXX")"
    sed -e "s|@CLUSTER_DIR@|$CLUSTER_DIR|g" -e "s|@NODE@|$NODE|g" -e "s|@NODE_LINE@|${NODE_LINE:-}|g" \
        -e "s|@SLURMCTLD_PORT@|$SLURMCTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
        -e "s|@SLURMDBD_PORT@|$SLURMDBD_PORT|g" -e "s|@MARIADB_PORT@|$MARIADB_PORT|g" \
        -e "s|@PG_PORT@|$PG_PORT|g" -e "s|@PG_USER@|$PG_USER|g" -e "s|@MUNGE_SOCKET@|$MUNGE_SOCKET|g" \
        -e "s|@ACCOUNTING_STORAGE@|${ACCOUNTING_STORAGE:-}|g" -e "s|@MARIADB_PASSWORD@|${MARIADB_PASSWORD:-}|g" \
        "$REPO/cluster/$template" >"$tmp"
    chmod "$mode" "$tmp" && mv "$tmp" "$out"
}

# refuse to start $1 on port $2 when something else listens there
check_port_free() {
    if port_open "$2"; then die "port $2 (for $1) is in use by another process; set $3 to a free port"; fi
}

# last line of log $1, for one-line errors
last_log() { [[ -s "$1" ]] && tail -n1 "$1" | cut -c1-200 || echo "no log"; }

started() { log "$1 started (pid $(running_pid "$2" || echo ?))"; }

# ---------------------------------------------------------------- munged (Slurm's authentication)
start_munge() {
    if running_pid munged >/dev/null; then log "munged already running"; return; fi
    # the socket directory must be searchable by all (munged checks); the key itself is 0600
    install -d -o munge -g munge -m 755 "$MUNGE_DIR"
    if [[ ! -s "$MUNGE_DIR/munge.key" ]]; then
        runuser -u munge -- mungekey --create --keyfile="$MUNGE_DIR/munge.key"
    fi
    runuser -u munge -- munged --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" ||
        die "munged did not start: $(last_log "$MUNGE_DIR/munged.log")"
    cp "$MUNGE_DIR/munged.pid" "$RUN/munged.pid"
    started munged munged
}

# ---------------------------------------------------------------- MariaDB + slurmdbd (accounting)
start_mariadb() {
    if running_pid mariadb >/dev/null; then log "MariaDB already running"; return; fi
    check_port_free MariaDB "$MARIADB_PORT" DMLBENCH_MARIADB_PORT
    render mariadb.cnf.in "$MARIADB_CNF"
    if [[ ! -d "$CLUSTER_DIR/mariadb/mysql" ]]; then
        log "initialising MariaDB for slurmdbd"
        mkdir -p "$CLUSTER_DIR/mariadb"
        mariadb-install-db --defaults-file="$MARIADB_CNF" --user=root --skip-test-db \
            --auth-root-authentication-method=socket >"$LOGS/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db failed: $(last_log "$LOGS/mariadb-install.log")"
    fi
    setsid mariadbd --defaults-file="$MARIADB_CNF" --user=root </dev/null >>"$LOGS/mariadb.log" 2>&1 &
    wait_port "$MARIADB_PORT" 60 || die "MariaDB did not start within 60 s: $(last_log "$LOGS/mariadb.log")"
    started MariaDB mariadb
}

start_slurmdbd() {
    if running_pid slurmdbd >/dev/null; then log "slurmdbd already running"; return; fi
    check_port_free slurmdbd "$SLURMDBD_PORT" DMLBENCH_SLURMDBD_PORT
    MARIADB_PASSWORD="$(secret mariadb_slurm_password)"
    # the password travels on stdin, not on a command line
    mariadb --socket="$RUN/mariadb.sock" -u root <<SQL || die "could not create MariaDB's slurm user (log: $LOGS/mariadb.log)"
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$MARIADB_PASSWORD';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$MARIADB_PASSWORD';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL
    # slurmdbd reads slurmdbd.conf beside $SLURM_CONF and wants it private to SlurmUser
    render slurmdbd.conf.in "$SLURM_DIR/slurmdbd.conf" 600
    slurmdbd >>"$LOGS/slurmdbd.log" 2>&1 || die "slurmdbd did not start: $(last_log "$LOGS/slurmdbd.log")"
    wait_port "$SLURMDBD_PORT" 60 || die "slurmdbd did not listen within 60 s: $(last_log "$LOGS/slurmdbd.log")"
    started slurmdbd slurmdbd
}

register_cluster() {
    # slurmctld registers with slurmdbd only for a cluster the database knows
    if ! sacctmgr --noheader --parsable2 show cluster format=cluster 2>/dev/null | grep -qx dmlbench; then
        sacctmgr --immediate add cluster dmlbench >/dev/null || die "sacctmgr add cluster dmlbench failed (log: $LOGS/slurmdbd.log)"
        log "cluster dmlbench registered in slurmdbd"
    fi
}

# ---------------------------------------------------------------- slurmctld + slurmd
write_slurm_conf() {
    mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool"
    # this machine's CPUs, sockets and memory, as slurmd itself detects them
    NODE_LINE="$(slurmd -C | head -n1)"
    [[ "$NODE_LINE" == NodeName=* ]] || die "slurmd -C did not describe this node: $NODE_LINE"
    # Slots for jobs: DMLBENCH_SLURM_CPUS, by default 4 per real CPU. The jobs of a development
    # cluster are small and mostly wait (a tune stage's job waits for its worker array; DVC stages
    # wait for the lock), and with the real count a 2-core machine runs one 2-CPU job at a time.
    # slurmd accepts the count through SlurmdParameters=config_overrides (slurm.conf.in).
    local cpus="${DMLBENCH_SLURM_CPUS:-$(($(nproc) * 4))}"
    [[ "$cpus" =~ ^[1-9][0-9]*$ ]] || die "DMLBENCH_SLURM_CPUS must be a positive integer, got '$cpus'"
    NODE_LINE="$(sed -E "s/ (Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=[0-9]+//g; s/CPUs=[0-9]+/CPUs=$cpus/" <<<"$NODE_LINE")"
    ACCOUNTING_STORAGE=accounting_storage/none
    [[ "$ACCOUNTING" == slurmdbd ]] && ACCOUNTING_STORAGE=accounting_storage/slurmdbd
    render slurm.conf.in "$SLURM_CONF"
}

start_slurm() {
    if running_pid slurmctld >/dev/null; then
        log "slurmctld already running"
    else
        check_port_free slurmctld "$SLURMCTLD_PORT" DMLBENCH_SLURMCTLD_PORT
        slurmctld >>"$LOGS/slurmctld.log" 2>&1 || die "slurmctld did not start: $(last_log "$LOGS/slurmctld.log")"
        wait_port "$SLURMCTLD_PORT" 60 || die "slurmctld did not listen within 60 s: $(last_log "$LOGS/slurmctld.log")"
        started slurmctld slurmctld
    fi
    if running_pid slurmd >/dev/null; then
        log "slurmd already running"
    else
        check_port_free slurmd "$SLURMD_PORT" DMLBENCH_SLURMD_PORT
        slurmd >>"$LOGS/slurmd.log" 2>&1 || die "slurmd did not start: $(last_log "$LOGS/slurmd.log")"
        wait_port "$SLURMD_PORT" 60 || die "slurmd did not listen within 60 s: $(last_log "$LOGS/slurmd.log")"
        started slurmd slurmd
    fi
    local state i
    for ((i = 0; i < 60; i++)); do
        state="$(sinfo --noheader --nodes="$NODE" --format=%T 2>/dev/null | head -n1)"
        case "$state" in
            idle* | mixed* | allocated* | completing*) break ;;
            down* | drain*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
        esac
        sleep 1
    done
    [[ "$state" =~ ^(idle|mixed|allocated|completing) ]] ||
        die "node $NODE is '${state:-unknown}' after 60 s, not idle: $(last_log "$LOGS/slurmd.log")"
    log "Slurm node $NODE is $state"
}

# plain `sbatch` / `sacct` (as the project's --executor slurm calls them) read /etc/slurm/slurm.conf:
# point it at ours unless the machine has its own
link_etc_slurm_conf() {
    local etc=/etc/slurm/slurm.conf
    if [[ -L "$etc" && "$(readlink "$etc")" == "$SLURM_CONF" ]]; then return; fi
    if [[ -e "$etc" || -L "$etc" ]]; then
        log "$etc exists and is not ours: Slurm's commands need SLURM_CONF=$SLURM_CONF (in $CLUSTER_DIR/env)"
        return
    fi
    mkdir -p /etc/slurm && ln -s "$SLURM_CONF" "$etc" && echo "$etc" >"$RUN/etc-slurm-conf.link"
}

# ---------------------------------------------------------------- PostgreSQL
start_postgres() {
    local bindir
    bindir="$(pg_bindir)" || die "no PostgreSQL server binaries (initdb) found"
    id -u "$PG_SUPERUSER" >/dev/null 2>&1 || die "no '$PG_SUPERUSER' user to run PostgreSQL as (install postgresql-15)"
    install -d -o "$PG_SUPERUSER" -g "$PG_SUPERUSER" -m 700 "$CLUSTER_DIR/postgres" "$PG_SOCKET_DIR"
    if [[ ! -s "$PG_DATA/PG_VERSION" ]]; then
        log "initialising PostgreSQL ($("$bindir/postgres" --version))"
        install -d -o "$PG_SUPERUSER" -g "$PG_SUPERUSER" -m 700 "$PG_DATA"
        as_postgres "$bindir/initdb" --pgdata="$PG_DATA" --username="$PG_SUPERUSER" --encoding=UTF8 \
            --locale=C.UTF-8 --auth-local=peer --auth-host=scram-sha-256 >"$LOGS/postgres-initdb.log" 2>&1 ||
            die "initdb failed: $(last_log "$LOGS/postgres-initdb.log")"
        echo "include_if_exists = 'dmlbench.conf'" >>"$PG_DATA/postgresql.conf"
    fi
    render postgresql.conf.in "$PG_DATA/dmlbench.conf"
    install -o "$PG_SUPERUSER" -g "$PG_SUPERUSER" -m 600 "$REPO/cluster/pg_hba.conf" "$PG_DATA/pg_hba.conf"
    chown "$PG_SUPERUSER:" "$PG_DATA/dmlbench.conf"
    if as_postgres "$bindir/pg_ctl" --pgdata="$PG_DATA" status >/dev/null 2>&1; then
        log "PostgreSQL already running"
    else
        check_port_free PostgreSQL "$PG_PORT" DMLBENCH_PG_PORT
        touch "$LOGS/postgres.log" && chown "$PG_SUPERUSER:" "$LOGS/postgres.log"
        as_postgres "$bindir/pg_ctl" --pgdata="$PG_DATA" --log="$LOGS/postgres.log" --wait --timeout=60 start >/dev/null ||
            die "PostgreSQL did not start: $(last_log "$LOGS/postgres.log")"
        log "PostgreSQL started (pid $(head -n1 "$PG_DATA/postmaster.pid"))"
    fi
    head -n1 "$PG_DATA/postmaster.pid" >"$RUN/postgres.pid"

    # the role and databases; the password from DMLBENCH_PG_PASSWORD or generated once
    local password="${DMLBENCH_PG_PASSWORD:-}"
    if [[ -n "$password" ]]; then
        (umask 077 && printf '%s' "$password" >"$SECRETS/pg_password")
    else
        password="$(secret pg_password)"
    fi
    [[ "$password" != *"'"* && "$password" != *:* && "$password" != *\\* ]] ||
        die "DMLBENCH_PG_PASSWORD must not contain ', : or \\"
    local psql=(as_postgres psql --no-psqlrc --quiet --host="$PG_SOCKET_DIR" --port="$PG_PORT" --dbname=postgres -v ON_ERROR_STOP=1)
    "${psql[@]}" <<SQL >/dev/null || die "could not create PostgreSQL role $PG_USER (log: $LOGS/postgres.log)"
SELECT 'CREATE ROLE $PG_USER LOGIN CREATEDB' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') \gexec
ALTER ROLE $PG_USER WITH LOGIN CREATEDB PASSWORD '$password';
SQL
    local db
    for db in $PG_DATABASES; do
        "${psql[@]}" <<SQL >/dev/null || die "could not create database $db (log: $LOGS/postgres.log)"
SELECT 'CREATE DATABASE $db OWNER $PG_USER' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$db') \gexec
SQL
    done
    # libpq's password file (https://www.postgresql.org/docs/15/libpq-pgpass.html): clients set PGPASSFILE
    (umask 077 && printf '127.0.0.1:%s:*:%s:%s\n' "$PG_PORT" "$PG_USER" "$password" >"$SECRETS/pgpass")
    log "PostgreSQL on 127.0.0.1:$PG_PORT: role $PG_USER, databases: $PG_DATABASES"
}

write_env() {
    cat >"$CLUSTER_DIR/env" <<EOF
# The local cluster (generated by cluster/up.sh; docs/cluster.md). In a shell: source .cluster/env
# Passwords are not in this file: they are read from .cluster/secrets/ (mode 0600) when sourced.
export SLURM_CONF=$SLURM_CONF
export PGPASSFILE=$SECRETS/pgpass
export DMLBENCH_PG_PORT=$PG_PORT
export DMLBENCH_MLFLOW_PORT=$MLFLOW_PORT
export DMLBENCH_SLURMCTLD_PORT=$SLURMCTLD_PORT
export DMLBENCH_SLURMD_PORT=$SLURMD_PORT
export DMLBENCH_SLURMDBD_PORT=$SLURMDBD_PORT
export DMLBENCH_MARIADB_PORT=$MARIADB_PORT
export DMLBENCH_SLURM_ACCOUNTING=$ACCOUNTING
# tuning.storage in params.yaml (Optuna's RDB storage; the password comes from PGPASSFILE)
export DMLBENCH_OPTUNA_STORAGE=postgresql://$PG_USER@127.0.0.1:$PG_PORT/optuna
# the team tracking server (make server)
export MLFLOW_TRACKING_URI=http://127.0.0.1:$MLFLOW_PORT
export MLFLOW_TRACKING_USERNAME=\${MLFLOW_TRACKING_USERNAME:-\${MLFLOW_AUTH_ADMIN_USERNAME:-admin}}
if [ -z "\${MLFLOW_TRACKING_PASSWORD:-}" ]; then
    if [ -n "\${MLFLOW_AUTH_ADMIN_PASSWORD:-}" ]; then export MLFLOW_TRACKING_PASSWORD="\$MLFLOW_AUTH_ADMIN_PASSWORD"
    elif [ -r $SECRETS/mlflow_admin_password ]; then export MLFLOW_TRACKING_PASSWORD="\$(cat $SECRETS/mlflow_admin_password)"
    fi
fi
# the port and artifact store of a running \`make server\`
if [ -r $CLUSTER_DIR/mlflow/server.env ]; then . $CLUSTER_DIR/mlflow/server.env; fi
EOF
}

# before starting anything: the port of every daemon not yet running must be free
check_ports() {
    running_pid postgres >/dev/null || check_port_free PostgreSQL "$PG_PORT" DMLBENCH_PG_PORT
    running_pid slurmctld >/dev/null || check_port_free slurmctld "$SLURMCTLD_PORT" DMLBENCH_SLURMCTLD_PORT
    running_pid slurmd >/dev/null || check_port_free slurmd "$SLURMD_PORT" DMLBENCH_SLURMD_PORT
    if [[ "$ACCOUNTING" == slurmdbd ]]; then
        running_pid slurmdbd >/dev/null || check_port_free slurmdbd "$SLURMDBD_PORT" DMLBENCH_SLURMDBD_PORT
        running_pid mariadb >/dev/null || check_port_free MariaDB "$MARIADB_PORT" DMLBENCH_MARIADB_PORT
    fi
}

# ---------------------------------------------------------------- main
check_ports
install_packages
mkdir -p "$RUN" "$LOGS" "$SLURM_DIR"
install -d -m 700 "$SECRETS"
log "starting the local cluster in $CLUSTER_DIR (ports: PostgreSQL $PG_PORT, slurmctld $SLURMCTLD_PORT, slurmd $SLURMD_PORT$([[ "$ACCOUNTING" == slurmdbd ]] && echo ", slurmdbd $SLURMDBD_PORT, MariaDB $MARIADB_PORT"))"
start_munge
write_slurm_conf
start_postgres &  # PostgreSQL comes up beside Slurm
PG_JOB=$!
if [[ "$ACCOUNTING" == slurmdbd ]]; then
    start_mariadb
    start_slurmdbd
    register_cluster
fi
start_slurm
link_etc_slurm_conf
wait "$PG_JOB" || die "PostgreSQL did not come up (see the message above)"
write_env
log "up in $((SECONDS - START)) s. In a shell: source $CLUSTER_DIR/env; the tracking server: make server; stop all: make cluster-down"
