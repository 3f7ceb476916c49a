# shellcheck shell=bash disable=SC2034
# Elastic relaunch of an `rfsdp train` job, shared by scripts/rfmpirun and scripts/hosts
# (`--restarts N`; sourced, not run). A job that ended on a rank or host failure is started
# again from the latest complete checkpoint of its --ckpt-dir (`--resume DIR/step-N`), with
# the same command line otherwise (the same --batch: the same global batch on however many
# ranks run it), until it ends by itself or N restarts are spent. The failed job's lock of
# the folder is taken over (`--ckpt-dir-force`: the launcher saw every process of that job
# end). Each restart says what failed, where it resumes and on how many ranks; a watcher
# says when the relaunched job logs its first step (from --log), how long after the fault.

# elastic_scan ARGS...: the options of the command that matter here
elastic_scan() {
  el_ckpt= el_log= el_batch= el_accum=1 el_save=
  while [ $# -gt 0 ]; do
    case "$1" in
      --ckpt-dir) el_ckpt=${2:-} ;;
      --log) el_log=${2:-} ;;
      --batch) el_batch=${2:-} ;;
      --accum) el_accum=${2:-1} ;;
      --save-every) el_save=${2:-} ;;
    esac
    shift
  done
}

# elastic_latest DIR: the latest complete checkpoint (DIR/step-N with its COMPLETE marker), or nothing
elastic_latest() {
  local d best= n bestn=-1
  for d in "$1"/step-*; do
    [ -e "$d/COMPLETE" ] || continue
    n=${d##*/step-}
    n=$((10#$n))
    if [ "$n" -gt "$bestn" ]; then
      bestn=$n
      best=$d
    fi
  done
  [ -n "$best" ] && echo "$best"
}

# elastic_failed STATUS OUTPUT_FILE: 0 when the job ended on a rank or host failure (a
# rank killed by a signal, MPICH's "BAD TERMINATION", the collective watchdog, a peer
# gone), 1 when it ended otherwise (done, a usage error, a bad file, a diverged run:
# a restart would only fail again)
elastic_failed() {
  case "$1" in 0 | 2) return 1 ;; esac
  [ "$1" -gt 128 ] && return 0
  [ "$1" = 9 ] && return 0
  grep -qE 'BAD TERMINATION|KILLED BY SIGNAL|collective watchdog|did not answer|rank [0-9]+ is gone' "$2"
}

# elastic_what OUTPUT_FILE STATUS: what failed, in a few words
elastic_what() {
  local line pid at code
  line=$(grep -m1 -oE 'collective watchdog: [^;]*;[^;]*|host [^ ]+ did not answer[^;]*|host [^ ]+ answers but its rank [0-9]+ is gone|fault: [^(]*' "$1")
  if [ -z "$line" ] && grep -q 'BAD TERMINATION' "$1"; then
    pid=$(grep -m1 -oE 'PID [0-9]+ RUNNING AT [^ ]+' "$1")
    code=$(grep -m1 -oE 'EXIT CODE: [0-9]+|KILLED BY SIGNAL: [0-9]+[^=]*' "$1")
    line="a rank ended abnormally (MPICH's BAD TERMINATION${pid:+, $pid}${code:+, $code})"
  fi
  echo "exit status $2${line:+: $line}"
}

# elastic_args LATEST ARGS...: ARGS without --resume X and --ckpt-dir-force, then
# --resume LATEST --ckpt-dir-force (into the array el_args)
elastic_args() {
  local latest=$1
  shift
  el_args=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --resume) shift 2; continue ;;
      --ckpt-dir-force) shift; continue ;;
    esac
    el_args+=("$1")
    shift
  done
  [ -z "$latest" ] || el_args+=(--resume "$latest")
  el_args+=(--ckpt-dir-force)
}

# elastic_steps LOG: the step lines in the --log file (0 when none)
elastic_steps() {
  local n=0
  [ -f "$1" ] && n=$(grep -c '^{"step":' "$1")
  echo "${n:-0}"
}

# elastic_watch WHO LOG SINCE FAULT_TIME K: in the background, says when LOG has a step line
# past its first SINCE lines: the first logged step after restart K, and the seconds since
# FAULT_TIME (date +%s.%N)
elastic_watch() {
  local who=$1 log=$2 since=$3 t0=$4 k=$5
  [ -n "$log" ] || return 0
  (
    while [ "$(elastic_steps "$log")" -le "$since" ]; do sleep 0.05; done
    step=$(grep '^{"step":' "$log" | sed -n "$((since + 1))p" | grep -oE '^\{"step":[0-9]+' | grep -oE '[0-9]+$')
    echo "$who: restart $k: step ${step:-?} logged $(awk -v a="$t0" -v b="$(date +%s.%N)" \
      'BEGIN{printf "%.1f", b - a}') s after the fault" >&2
  ) &
  el_watcher=$!
}
