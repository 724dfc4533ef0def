#!/bin/sh
# Ansible managed
# warmctl instance: tiny
# At boot: put vLLM instance "tiny" into the state its sleep windows say for this moment
# (inside a window: that window's sleep service; otherwise: awake), whatever order the
# Persistent= catch-up timers fired in.
set -u
inside() {
  rc=0
  /opt/warmctl/bin/warmctl calendar --in-window "$1" "$2" >/dev/null || rc=$?
  [ "$rc" -le 1 ] || exit "$rc"
  return "$rc"
}
if inside '0 0 1,15 * 5' @daily; then
  echo 'inside window nights: asleep'
  exec /usr/bin/systemctl start vllm-tiny-sleep-nights.service
fi
echo 'outside every sleep window: awake'
exec /usr/bin/systemctl start vllm-tiny-wake-nights.service
