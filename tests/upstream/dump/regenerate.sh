#!/bin/sh
# Regenerates tests/upstream/allocator_table.json from upstream's own allocator test table.
#
# It runs allocatortesting.TestAllocator of k8s.io/dynamic-resource-allocation (the module of
# staging/src/k8s.io/dynamic-resource-allocation) against the incubating and the experimental allocator, with an
# allocator wrapper that records every Allocate call: the inputs (features, allocated state, classes, slices,
# node, claims) and what upstream's allocator returned. The table's own assertions still run, so a recorded
# result is one that upstream's expectation accepted.
set -eu
VERSION=${1:-v0.37.2}  # k8s.io/dynamic-resource-allocation v0.37.2 == Kubernetes v1.37.2
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'chmod -R u+w "$WORK"; rm -rf "$WORK"' EXIT
SRC=$(cd "$WORK" && GOFLAGS=-mod=mod go mod download -json "k8s.io/dynamic-resource-allocation@$VERSION" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
cp -r "$SRC" "$WORK/dra"
chmod -R u+w "$WORK/dra"
for channel in incubating experimental; do
  sed "s/CHANNEL/$channel/g" "$HERE/dump_test.go.in" > "$WORK/dra/structured/internal/$channel/dump_test.go"
  (cd "$WORK/dra/structured/internal/$channel" \
    && GOFLAGS=-mod=mod DUMP_OUT="$WORK/$channel.json" go test -count=1 -run '^TestDump$' . >"$WORK/$channel.log" 2>&1) \
    || { cat "$WORK/$channel.log"; exit 1; }
done
python3 "$HERE/merge.py" "$VERSION" "$WORK/incubating.json" "$WORK/experimental.json" > "$HERE/../allocator_table.json"
