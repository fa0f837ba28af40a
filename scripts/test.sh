#!/usr/bin/env bash
# The test command: every test (unit, contract, integration on moto's server and SeaweedFS),
# then ruff and mypy. Installs what it needs into .venv first.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/bootstrap.sh"
cd "$root"
# The systemd unit tests run `systemd-analyze verify`; a fresh machine may lack it.
if ! command -v systemd-analyze >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
    else
        echo "systemd-analyze is missing: install the systemd package" >&2
    fi
fi
ruff check .
ruff format --check .
mypy
python -m pytest "$@"
