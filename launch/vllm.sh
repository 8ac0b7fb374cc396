#!/usr/bin/env bash
# Start `vllm serve MODEL` in the background, wait until it answers /v1/models, then exit 0 and leave it
# running (its pid, also its process group, is in the pid file). If it dies or is not ready within
# --ready-timeout, print the tail of its log, stop it and exit 1. It does not run regeneration.
#
#   launch/vllm.sh MODEL [--host H] [--port P] [--gpus 0,1,...] [--dp-size N] [--tp-size N]
#                  [--max-model-len N] [--reasoning-parser P] [--tool-call-parser P]
#                  [--log-file F] [--pid-file F] [--ready-timeout S] [--stop-grace S] [--dry-run]
#                  [any other `vllm serve` argument ...] [-- more vllm arguments]
#
# Stop it later with: kill -TERM -- -$(cat PIDFILE)
set -euo pipefail

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "vllm.sh: $*" >&2; exit 2; }

model="" host="127.0.0.1" port="8000" gpus="" dp="" tp="" max_model_len="" reasoning_parser=""
tool_call_parser="" log_file="" pid_file="" ready_timeout="1800" stop_grace="30" dry_run=0
passthrough=()

need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --model) need_value "$@"; model="$2"; shift 2 ;;
    --host) need_value "$@"; host="$2"; shift 2 ;;
    --port) need_value "$@"; port="$2"; shift 2 ;;
    --gpus) need_value "$@"; gpus="$2"; shift 2 ;;
    --dp-size) need_value "$@"; dp="$2"; shift 2 ;;
    --tp-size) need_value "$@"; tp="$2"; shift 2 ;;
    --max-model-len) need_value "$@"; max_model_len="$2"; shift 2 ;;
    --reasoning-parser) need_value "$@"; reasoning_parser="$2"; shift 2 ;;
    --tool-call-parser) need_value "$@"; tool_call_parser="$2"; shift 2 ;;
    --log-file) need_value "$@"; log_file="$2"; shift 2 ;;
    --pid-file) need_value "$@"; pid_file="$2"; shift 2 ;;
    --ready-timeout) need_value "$@"; ready_timeout="$2"; shift 2 ;;
    --stop-grace) need_value "$@"; stop_grace="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --) shift; passthrough+=("$@"); break ;;
    -*) passthrough+=("$1"); shift ;;
    *) if [[ -z "$model" ]]; then model="$1"; else passthrough+=("$1"); fi; shift ;;
  esac
done

[[ -n "$model" ]] || { usage >&2; die "no MODEL given"; }
for pair in "port:$port" "dp-size:$dp" "tp-size:$tp" "max-model-len:$max_model_len" \
            "ready-timeout:$ready_timeout" "stop-grace:$stop_grace"; do
  value="${pair#*:}"
  [[ -z "$value" || "$value" =~ ^[0-9]+$ ]] || die "--${pair%%:*} must be a whole number, got '$value'"
done
[[ -z "$gpus" || "$gpus" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--gpus must look like 0 or 0,1,2, got '$gpus'"

cmd=(vllm serve "$model" --host "$host" --port "$port")
[[ -n "$dp" ]] && cmd+=(--data-parallel-size "$dp")
[[ -n "$tp" ]] && cmd+=(--tensor-parallel-size "$tp")
[[ -n "$max_model_len" ]] && cmd+=(--max-model-len "$max_model_len")
[[ -n "$reasoning_parser" ]] && cmd+=(--reasoning-parser "$reasoning_parser")
[[ -n "$tool_call_parser" ]] && cmd+=(--enable-auto-tool-choice --tool-call-parser "$tool_call_parser")
cmd+=("${passthrough[@]}")
env_prefix=()
[[ -n "$gpus" ]] && env_prefix=("CUDA_VISIBLE_DEVICES=$gpus")

if [[ $dry_run -eq 1 ]]; then  # the exact command, shell-quoted
  printf '%s' "${env_prefix[@]/%/ }"
  printf '%q ' "${cmd[@]}" | sed 's/ $//'
  echo
  exit 0
fi

log_file="${log_file:-out/servers/vllm-$port.log}"
pid_file="${pid_file:-out/servers/vllm-$port.pid}"
base_url="http://$host:$port"
poll_s="${VLLM_READY_POLL_S:-2}"
auth=()
[[ -n "${VLLM_API_KEY:-}" ]] && auth=(-H "Authorization: Bearer $VLLM_API_KEY")

probe() { curl -sf -m 5 "${auth[@]}" "$base_url/v1/models" >/dev/null 2>&1; }
show_log_tail() {
  echo "---- last 40 lines of $log_file ----" >&2
  tail -n 40 "$log_file" >&2 || true
  echo "----" >&2
}
group_alive() { kill -0 -- "-$1" 2>/dev/null; }
stop_server() {
  group_alive "$pid" || { rm -f "$pid_file"; return 0; }
  kill -TERM -- "-$pid" 2>/dev/null || true
  local waited=0
  while group_alive "$pid" && (( waited < stop_grace * 10 )); do sleep 0.1; waited=$((waited + 1)); done
  group_alive "$pid" && kill -KILL -- "-$pid" 2>/dev/null
  rm -f "$pid_file"
}

command -v vllm >/dev/null || die "vllm is not on PATH (pip install vllm, or activate its environment)"
command -v curl >/dev/null || die "curl is needed to check readiness"
if probe; then
  echo "vllm.sh: a server already answers on $base_url; stop it or choose another --port" >&2
  exit 1
fi
mkdir -p "$(dirname "$log_file")" "$(dirname "$pid_file")"
echo "vllm.sh: starting: ${env_prefix[*]} ${cmd[*]}" >&2
echo "vllm.sh: log: $log_file" >&2

# setsid: the server gets its own session and process group (pid = pgid), so terminal signals meant for
# this script do not reach it directly and one signal to the group stops it with all its workers.
if [[ -n "$gpus" ]]; then
  CUDA_VISIBLE_DEVICES="$gpus" setsid "${cmd[@]}" >"$log_file" 2>&1 </dev/null &
else
  setsid "${cmd[@]}" >"$log_file" 2>&1 </dev/null &
fi
pid=$!
echo "$pid" >"$pid_file"

interrupted() { trap '' INT TERM; echo "vllm.sh: interrupted; stopping the server (pid $pid)" >&2; stop_server; exit 130; }
trap interrupted INT TERM

deadline=$((SECONDS + ready_timeout))
while true; do
  if ! kill -0 "$pid" 2>/dev/null; then
    status=0; wait "$pid" || status=$?
    echo "vllm.sh: vllm exited with status $status before it was ready" >&2
    show_log_tail
    stop_server
    exit 1
  fi
  if probe; then
    echo "vllm.sh: ready at $base_url (pid $pid; stop with: kill -TERM -- -$pid)" >&2
    exit 0
  fi
  if (( SECONDS >= deadline )); then
    echo "vllm.sh: not ready after ${ready_timeout}s; stopping it (pid $pid)" >&2
    show_log_tail
    stop_server
    exit 1
  fi
  sleep "$poll_s"
done
