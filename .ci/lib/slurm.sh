# Shell functions shared by the single-node SLURM (.ci/slurm-up.sh, .ci/slurm-down.sh) and the emulated cluster's
# (.ci/cluster/slurm-up.sh, .ci/cluster/slurm-down.sh): munge, waiting for nodes, stopping daemons, /etc/hosts.
# Source it; every function reports on stderr, prefixed with $LOG_PREFIX (the calling script's name).

LOG_PREFIX=${LOG_PREFIX:-slurm}

require_commands() {  # require_commands CMD...: fail naming the Debian packages when one is missing
  local cmd
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null || { echo "$LOG_PREFIX: $cmd missing (apt-get install slurm-wlm munge)" >&2; exit 1; }
  done
}

dump_logs() {  # dump_logs FILE...: the tail of each log that exists, for a failure's post-mortem
  local file
  for file in "$@"; do
    [ -f "$file" ] && { echo "===== $file"; tail -n 50 "$file"; }
  done >&2
}

ensure_munge_key() {  # the machine's munge key, created if the package made none; munged refuses one others can read
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
}

start_munged() {  # start_munged DIR: our own munged on the private socket DIR/munge.socket.2, as the munge user
  local dir=$1
  ensure_munge_key
  mkdir -p "$dir"
  chown munge:munge "$dir"
  runuser -u munge -- munged --socket="$dir/munge.socket.2" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" || return 1
  timeout 5 sh -c "munge -n -S '$dir/munge.socket.2' | unmunge -S '$dir/munge.socket.2' >/dev/null" \
    || { echo "$LOG_PREFIX: munge self-test failed" >&2; return 1; }
}

wait_nodes_ready() {  # wait_nodes_ready COUNT SECONDS: COUNT nodes registered (idle, or busy with jobs)
  local count=$1 deadline=$((SECONDS + $2)) ready=0
  while [ $SECONDS -lt $deadline ]; do
    ready=$(timeout 5 sinfo -h -N -t idle,mix,alloc,comp -o %N 2>/dev/null | sort -u | wc -l || true)
    [ "$ready" -ge "$count" ] && return 0
    sleep 0.5
  done
  echo "$LOG_PREFIX: $ready of $count nodes ready after ${2}s" >&2
  timeout 5 sinfo -N -l >&2 || true
  return 1
}

cancel_jobs() {  # cancel every job and wait (10 s at most) until none is left: its steps outlive slurmd otherwise
  local i
  timeout 10 scancel --user=root 2>/dev/null || true
  for i in $(seq 50); do
    [ -z "$(timeout 5 squeue -h -t running,completing,pending -o %i 2>/dev/null)" ] && return 0
    sleep 0.2
  done
}

stop_daemons() {  # stop_daemons PIDFILE...: TERM each daemon a pid file names (NAME.pid or NAME-SUFFIX.pid), KILL after 10 s
  local pidfile pid name pids=() i alive
  for pidfile in "$@"; do
    pid=$(cat "$pidfile" 2>/dev/null) || continue
    name=$(basename "$pidfile" .pid)
    # Only a live process with the daemon's name: a stale pid file may name a reused pid.
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${name%%-*}" ] || continue
    kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  # Each daemon needs ~2 s to exit, so signal them together and wait once.
  for i in $(seq 50); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.2
  done
  echo "$LOG_PREFIX: ${pids[*]} ignored SIGTERM, killing" >&2
  kill -9 "${pids[@]}" 2>/dev/null || true
}

# /etc/hosts is shared by the test SLURM and the emulated cluster, which tests running side by side may start or stop
# at the same moment: every edit holds the file's flock. It is often a bind mount in containers: edited in place, never
# replaced (as sed -i's rename would).
append_lines() {  # append_lines FILE TEXT: append TEXT to FILE
  { flock 9; printf '%s' "$2" >> "$1"; } 9<"$1"
}

remove_tagged_lines() {  # remove_tagged_lines FILE MARK: drop the lines carrying MARK
  local kept
  {
    flock 9
    if grep -qF "$2" "$1"; then
      kept=$(grep -vF "$2" "$1" || true)
      printf '%s\n' "$kept" > "$1"
    fi
  } 9<"$1"
}
