#!/bin/sh
# Ansible managed
# warmctl instance: qwen
# At boot: put vLLM instance "qwen" into the state its sleep windows say for this moment
# (inside a window: that window's sleep service; otherwise: awake), whatever order the
# Persistent= catch-up timers fired in.
set -u
inside() {
  rc=0
  /opt/warmctl/bin/warmctl calendar --in-window "$1" "$2" >/dev/null || rc=$?
  [ "$rc" -le 1 ] || exit "$rc"
  return "$rc"
}
if inside '0 20 * * 1-5' '30 7 * * 1-5'; then
  echo 'inside window nights: asleep'
  exec /usr/bin/systemctl start vllm-qwen-sleep-nights.service
fi
if inside 'Fri *-*-* 21:00:00' 'Mon *-*-* 07:00:00'; then
  echo 'inside window weekend: asleep'
  exec /usr/bin/systemctl start vllm-qwen-sleep-weekend.service
fi
echo 'outside every sleep window: awake'
exec /usr/bin/systemctl start vllm-qwen-wake-nights.service
