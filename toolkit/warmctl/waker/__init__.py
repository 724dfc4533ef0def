"""`warmctl waker`: idle sleep and wake on request for one proxied instance (docs/IDLE-SLEEP.md).

A long-running, unprivileged process beside the instance (`vllm-NAME-waker.service`, as the vLLM
service user), speaking to the host's nginx through two unix sockets in the gate folder and to
systemd through request files there; it never starts, stops, sleeps or wakes anything itself:

The gate's flag files it reads and the request files it creates: warmctl.sleepwake.gate (one model).

- `hold.py`     a request that reached the instance asleep-and-wakeable is held; the first asks
                for one wake (the wake-request file, a path unit runs `warmctl wake`); all are
                released in arrival order once awake, or refused (failed, timeout, refused)
- `http.py`     the hold's door: HTTP/1.1 on a unix stream socket, answering nginx's
                `auth_request` subrequest (204 pass, 403 refuse; header `X-Warmctl-Wake`)
- `connections.py`  that door's accept loop: a bound on its connections (an idle one makes
                room), one log line per connection storm
- `detector.py` a sleep trigger's detector (warmctl.sleepwake.triggers): what it is given,
                how the waker finds it by its kind, the proxy's activity log it may read
- `idle.py`     the idle sleep's detector: nginx's access log of the instance's /v1/ requests
                as syslog datagrams on a unix socket (each one = activity), vLLM's `/load`
                (nothing in flight), then its request file (a path unit runs `warmctl sleep`)
- `metrics.py`  its own Prometheus textfile beside the instance's (`warmctl_NAME.waker.prom`)
- `service.py`  the options checked, the sockets bound, the loop run until SIGTERM
- `wakehere.py` the waker's own wake (GPU): warmctl.sleepwake.actions.wake_instance in a thread
"""
