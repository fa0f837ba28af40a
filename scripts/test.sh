#!/usr/bin/env bash
# The test command: every test (unit, contract, integration on moto's server and SeaweedFS),
# then ruff and mypy. Installs what it needs into .venv first.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/bootstrap.sh"
cd "$root"
ruff check .
ruff format --check .
mypy
python -m pytest "$@"
