#!/usr/bin/env bash
# Start `vllm serve MODEL` in the background, wait until it is ready, then exit 0 and leave it running
# (its pid, also its process group, is in the pid file). Ready: /health answers, then /v1/models with
# the API key (the first --api-key passed to vllm, else $VLLM_API_KEY; never printed); a --headless node
# serves no HTTP, so it is ready while it runs and its head answers /health. If vllm dies, is not ready
# within --ready-timeout, or refuses the key (401/403), print why, stop it and exit 1. It does not run
# regeneration.
#
#   launch/vllm.sh MODEL [--host H] [--port P] [--gpus 0,1,...] [--dp-size N] [--tp-size N]
#                  [--dp-size-local K] [--dp-address A] [--dp-rpc-port P] [--dp-start-rank R]
#                  [--headless [--head-url URL]] [--max-model-len N] [--reasoning-parser P]
#                  [--tool-call-parser P] [--log-file F] [--pid-file F] [--ready-timeout S]
#                  [--stop-grace S] [--dry-run] [any other `vllm serve` argument ...] [-- more vllm arguments]
#
# Stop it later with: kill -TERM -- -$(cat PIDFILE)
set -euo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "vllm.sh: $*" >&2; exit 2; }

model="" host="127.0.0.1" port="8000" gpus="" dp="" tp="" dp_local="" dp_address="" dp_rpc_port=""
dp_start_rank="" headless=0 head_url="" max_model_len="" reasoning_parser="" tool_call_parser=""
log_file="" pid_file="" ready_timeout="1800" stop_grace="30" dry_run=0
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
    --dp-size-local) need_value "$@"; dp_local="$2"; shift 2 ;;
    --dp-address) need_value "$@"; dp_address="$2"; shift 2 ;;
    --dp-rpc-port) need_value "$@"; dp_rpc_port="$2"; shift 2 ;;
    --dp-start-rank) need_value "$@"; dp_start_rank="$2"; shift 2 ;;
    --headless) headless=1; shift ;;
    --head-url) need_value "$@"; head_url="$2"; shift 2 ;;
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
for pair in "port:$port" "dp-size:$dp" "tp-size:$tp" "dp-size-local:$dp_local" "dp-rpc-port:$dp_rpc_port" \
            "dp-start-rank:$dp_start_rank" "max-model-len:$max_model_len" "ready-timeout:$ready_timeout" \
            "stop-grace:$stop_grace"; do
  value="${pair#*:}"
  [[ -z "$value" || "$value" =~ ^[0-9]+$ ]] || die "--${pair%%:*} must be a whole number, got '$value'"
done
[[ -z "$gpus" || "$gpus" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--gpus must look like 0 or 0,1,2, got '$gpus'"
if [[ $headless -eq 1 ]]; then
  [[ -n "$dp" && -n "$dp_address" && -n "$dp_rpc_port" ]] \
    || die "--headless needs --dp-size, --dp-address and --dp-rpc-port (the head node's values)"
  head_url="${head_url:-http://$dp_address:$port}"
else
  [[ -z "$head_url" ]] || die "--head-url is for --headless nodes only"
  [[ -z "$dp_start_rank" ]] || die "--dp-start-rank is for --headless nodes (the head runs the first ranks)"
fi
if [[ -n "$dp_local" ]]; then
  [[ -n "$dp" ]] || die "--dp-size-local needs --dp-size (the total number of data-parallel ranks)"
  (( dp_local <= dp )) || die "--dp-size-local $dp_local is more than --dp-size $dp"
fi

if [[ $headless -eq 1 ]]; then  # no API server on a headless node
  cmd=(vllm serve "$model" --headless)
else
  cmd=(vllm serve "$model" --host "$host" --port "$port")
fi
[[ -n "$dp" ]] && cmd+=(--data-parallel-size "$dp")
[[ -n "$dp_local" ]] && cmd+=(--data-parallel-size-local "$dp_local")
[[ -n "$dp_start_rank" ]] && cmd+=(--data-parallel-start-rank "$dp_start_rank")
[[ -n "$dp_address" ]] && cmd+=(--data-parallel-address "$dp_address")
[[ -n "$dp_rpc_port" ]] && cmd+=(--data-parallel-rpc-port "$dp_rpc_port")
[[ -n "$tp" ]] && cmd+=(--tensor-parallel-size "$tp")
[[ -n "$max_model_len" ]] && cmd+=(--max-model-len "$max_model_len")
[[ -n "$reasoning_parser" ]] && cmd+=(--reasoning-parser "$reasoning_parser")
[[ -n "$tool_call_parser" ]] && cmd+=(--enable-auto-tool-choice --tool-call-parser "$tool_call_parser")
cmd+=("${passthrough[@]}")
env_prefix=()
[[ -n "$gpus" ]] && env_prefix=("CUDA_VISIBLE_DEVICES=$gpus")

# The key vLLM will check: the first --api-key passed through (vLLM prefers it to $VLLM_API_KEY), else
# $VLLM_API_KEY. The readiness probe sends it; every command line this script prints shows *** instead.
probe_key="${VLLM_API_KEY:-}"
shown=()
for ((i = 0; i < ${#cmd[@]}; i++)); do
  arg="${cmd[i]}"
  if [[ "$arg" == --api-key && $((i + 1)) -lt ${#cmd[@]} ]]; then
    [[ -n "${api_key_seen:-}" ]] || probe_key="${cmd[i + 1]}"
    api_key_seen=1; shown+=("$arg" "***"); i=$((i + 1)); continue
  elif [[ "$arg" == --api-key=* ]]; then
    [[ -n "${api_key_seen:-}" ]] || probe_key="${arg#--api-key=}"
    api_key_seen=1; shown+=("--api-key=***"); continue
  fi
  shown+=("$arg")
done

if [[ $dry_run -eq 1 ]]; then  # the exact command, shell-quoted (an API key shown as ***)
  printf '%s' "${env_prefix[@]/%/ }"
  printf '%q ' "${shown[@]}" | sed 's/ $//; s/\\\*\\\*\\\*/***/g'
  echo
  exit 0
fi

name="vllm-$port"
[[ $headless -eq 1 ]] && name="vllm-headless-rank${dp_start_rank:-0}"
log_file="${log_file:-out/servers/$name.log}"
pid_file="${pid_file:-out/servers/$name.pid}"
base_url="http://$host:$port"
poll_s="${VLLM_READY_POLL_S:-2}"

# The HTTP status of GET URL (000: no answer) with curl; the API key (if any) goes in a header read from
# stdin, never on a command line.
http_status() {
  if [[ -n "$probe_key" && "$2" == "with-key" ]]; then
    printf 'Authorization: Bearer %s\n' "$probe_key" | curl -s -m 5 -o /dev/null -w '%{http_code}' -H @- "$1" 2>/dev/null
  else
    curl -s -m 5 -o /dev/null -w '%{http_code}' "$1" 2>/dev/null
  fi
}
http_ok() { [[ "$(http_status "$@")" == 200 ]]; }
probe() {  # vLLM serves /health without the key; /v1/models needs it when the server has one
  if [[ $headless -eq 1 ]]; then http_ok "$head_url/health" no-key; return; fi
  http_ok "$base_url/health" no-key || return 1
  models_status="$(http_status "$base_url/v1/models" with-key)"
  [[ "$models_status" == 200 ]]
}
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
if [[ $headless -eq 0 ]] && http_ok "$base_url/health" no-key; then
  echo "vllm.sh: a server already answers on $base_url; stop it or choose another --port" >&2
  exit 1
fi
mkdir -p "$(dirname "$log_file")" "$(dirname "$pid_file")"
echo "vllm.sh: starting: ${env_prefix[*]} ${shown[*]}" >&2
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
  models_status=""
  if probe; then
    if [[ $headless -eq 1 ]]; then
      echo "vllm.sh: headless node running (pid $pid) and its head $head_url answers /health" >&2
    else
      echo "vllm.sh: ready at $base_url (pid $pid; stop with: kill -TERM -- -$pid)" >&2
    fi
    exit 0
  fi
  if [[ "$models_status" == 401 || "$models_status" == 403 ]]; then  # up, but it refuses the key: waiting cannot help
    which="no key (neither --api-key nor \$VLLM_API_KEY is given)"
    [[ -n "$probe_key" ]] && which="the key given as \$VLLM_API_KEY"
    [[ -n "${api_key_seen:-}" ]] && which="the key given as --api-key"
    echo "vllm.sh: the server is up but /v1/models answers HTTP $models_status to the readiness probe, which sends $which: it wants another API key; give the server's key as VLLM_API_KEY or --api-key; stopping it (pid $pid)" >&2
    stop_server
    exit 1
  fi
  if (( SECONDS >= deadline )); then
    what="ready"; [[ $headless -eq 1 ]] && what="joined (the head $head_url does not answer /health)"
    echo "vllm.sh: not $what after ${ready_timeout}s; stopping it (pid $pid)" >&2
    show_log_tail
    stop_server
    exit 1
  fi
  sleep "$poll_s"
done
