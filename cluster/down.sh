#!/usr/bin/env bash
# make cluster-down: stop what cluster/up.sh and cluster/server.sh started, by their pid files under
# .cluster/run/, in the reverse order of their start; then check that none of the cluster's ports
# still listens. Data (PostgreSQL, MariaDB, Slurm state, MLflow artifacts) stays in .cluster/:
# `make cluster-up` brings it back; `rm -rf .cluster` after a cluster-down starts afresh.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
START=$SECONDS
[[ -f "$CLUSTER_DIR/env" ]] && source "$CLUSTER_DIR/env"  # the ports up.sh used
PG_PORT="${DMLBENCH_PG_PORT:-$PG_PORT}"
[[ -d "$RUN" ]] || { log "nothing to stop ($RUN does not exist)"; exit 0; }
[[ $EUID -eq 0 ]] || die "run as root (the daemons run as root, postgres and munge)"

# TERM the processes with pid files $RUN/<name>.pid (all at once; "mlflow": its whole process
# group), wait up to 15 s for each, then KILL what is left
stop() {
    local name pid i n pids=() names=()
    for name in "$@"; do
        if ! pid="$(running_pid "$name")"; then
            rm -f "$RUN/$name.pid"
            continue
        fi
        if [[ "$name" == mlflow ]]; then kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"; else kill -TERM "$pid"; fi
        pids+=("$pid") && names+=("$name")
    done
    for i in "${!pids[@]}"; do
        for ((n = 0; n < 150; n++)); do
            kill -0 "${pids[$i]}" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "${pids[$i]}" 2>/dev/null; then
            log "${names[$i]} (pid ${pids[$i]}) did not stop within 15 s; killing it"
            [[ "${names[$i]}" == mlflow ]] && { kill -KILL -- "-${pids[$i]}" 2>/dev/null || true; }
            kill -KILL "${pids[$i]}" 2>/dev/null || true
        fi
        rm -f "$RUN/${names[$i]}.pid"
        log "${names[$i]} stopped (pid ${pids[$i]})"
    done
}

# jobs still queued or running would outlive slurmd (slurmstepd): cancel them first
if running_pid slurmctld >/dev/null && [[ -f "$CLUSTER_DIR/slurm/slurm.conf" ]]; then
    jobs="$(SLURM_CONF="$CLUSTER_DIR/slurm/slurm.conf" squeue --noheader --format=%A 2>/dev/null | sort -u | tr '\n' ' ')"
    if [[ -n "${jobs// /}" ]]; then
        log "cancelling Slurm jobs: $jobs"
        # shellcheck disable=SC2086
        SLURM_CONF="$CLUSTER_DIR/slurm/slurm.conf" scancel $jobs 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            [[ -z "$(SLURM_CONF="$CLUSTER_DIR/slurm/slurm.conf" squeue --noheader --format=%A 2>/dev/null)" ]] && break
            sleep 0.2
        done
    fi
fi
# in three waves, each stopping side by side (a daemon takes ~2 s to end): the MLflow server (its
# own process group, with its workers) and Slurm's node and controller daemons; slurmdbd (which
# may still get slurmctld's last records) and PostgreSQL (pg_ctl's fast shutdown ends its own
# children); MariaDB (slurmdbd's store) and munged (all of Slurm authenticates through it)
stop mlflow slurmd slurmctld
if running_pid postgres >/dev/null; then
    as_postgres "$(pg_bindir)/pg_ctl" --pgdata="$CLUSTER_DIR/postgres/data" --mode=fast --no-wait stop >/dev/null 2>&1 || true
fi
stop slurmdbd postgres
stop mariadb munged

# the /etc/slurm/slurm.conf link up.sh made (only that one)
if [[ -s "$RUN/etc-slurm-conf.link" ]]; then
    link="$(cat "$RUN/etc-slurm-conf.link")"
    [[ -L "$link" && "$(readlink "$link")" == "$CLUSTER_DIR/slurm/slurm.conf" ]] && rm -f "$link"
    rm -f "$RUN/etc-slurm-conf.link"
fi

# the ports this cluster used (those of .cluster/env, and the server's of .cluster/mlflow/server.env)
ports=("$PG_PORT" "${DMLBENCH_SLURMCTLD_PORT:-$SLURMCTLD_PORT}" "${DMLBENCH_SLURMD_PORT:-$SLURMD_PORT}")
if [[ "${DMLBENCH_SLURM_ACCOUNTING:-$ACCOUNTING}" == slurmdbd ]]; then
    ports+=("${DMLBENCH_SLURMDBD_PORT:-$SLURMDBD_PORT}" "${DMLBENCH_MARIADB_PORT:-$MARIADB_PORT}")
fi
[[ -f "$CLUSTER_DIR/mlflow/server.env" ]] && ports+=("${MLFLOW_TRACKING_URI##*:}")
busy=()
for port in "${ports[@]}"; do
    port_open "$port" && busy+=("$port")
done
rm -f "$CLUSTER_DIR/mlflow/server.env"  # no server any more: .cluster/env stops pointing at one
((${#busy[@]} == 0)) || die "still listening after cluster-down: port(s) ${busy[*]} (not started by cluster-up, or they did not stop)"
log "down in $((SECONDS - START)) s; nothing of the cluster listens any more (data kept in $CLUSTER_DIR)"
