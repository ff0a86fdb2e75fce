#!/usr/bin/env bash
# The Ray head of the compose cluster and, beside it, the gdnval Ray driver listener: the service
# (a container without a raylet, outside the cluster) gets its Ray driver here, on a node of the
# cluster (python -m workers.executors.ray_driver, docs/deploy.md). Either process ending ends
# the container, and its restart policy starts both again.
set -euo pipefail
ray start --head --port=6379 --num-cpus=0 --num-gpus=0 --dashboard-host=0.0.0.0 --block &
GDNVAL_RAY_ADDRESS=127.0.0.1:6379 python -m workers.executors.ray_driver --listen 0.0.0.0:6380 &
wait -n
exit 1
