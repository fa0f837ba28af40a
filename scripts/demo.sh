#!/usr/bin/env bash
# The main job on the embedded default: make sample data, back it up to a local directory store,
# restore it, and prove the restore byte for byte. Everything lives under ./demo (re-runnable).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/bootstrap.sh"
demo="$root/demo"
rm -rf "$demo/restore"
mkdir -p "$demo"
store="file://$demo/store"
export MUSHROOM_BACKUP_LOG_FORMAT="${MUSHROOM_BACKUP_LOG_FORMAT:-text}"

echo "== sample data in $demo/source"
python "$root/scripts/sample_data.py" "$demo/source"

echo "== backup now --store $store"
mushroom-backup backup now --source "$demo/source" --store "$store"

echo "== snapshots"
mushroom-backup snapshots --store "$store"

echo "== lease status (released after the backup)"
mushroom-backup lease status --store "$store"

echo "== restore latest --target $demo/restore"
mushroom-backup restore latest --target "$demo/restore" --store "$store"

echo "== verify: every byte, mode and link of the restore matches the source"
python "$root/scripts/compare_trees.py" "$demo/source" "$demo/restore"
