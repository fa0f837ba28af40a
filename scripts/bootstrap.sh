#!/usr/bin/env bash
# Create .venv (once) and install mushroom-backup with its test extras, pinned by constraints.txt.
# Sourced by demo.sh and test.sh; safe to run again (pip skips what is already installed).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
stamp="$venv/.installed-$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -c "$root/constraints.txt" -e "$root[test]"
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
