#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from the Go
# modules pinned in go.mod/go.sum, into a cache directory outside the repository.
#
# Prints the directory holding the binaries as the LAST line of stdout (the launcher reads it).
# When the binaries for the pinned versions already exist it only prints that directory, so it
# is cheap to call before every test run.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

k8s_version="$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' go.mod)"
if [[ -z "$k8s_version" ]]; then
    echo "build.sh: cannot find the k8s.io/kubernetes version in go.mod" >&2
    exit 1
fi
# Any change to the pinned modules or to our own Go source gives a new directory, so a stale
# build is never reused.
inputs_hash="$(cat go.mod go.sum cmd/etcd/main.go | sha256sum | cut -c1-12)"
cache_root="${CLAIMSCOPE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/claimscope/controlplane}"
out="$cache_root/$k8s_version-$inputs_hash"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)

if [[ -f "$out/.complete" ]]; then
    echo "build.sh: up to date" >&2
    echo "$out"
    exit 0
fi

go_bin="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
echo "build.sh: building ${binaries[*]} $k8s_version with $("$go_bin" env GOVERSION) into $out" >&2

# Build into a scratch directory and rename at the end: an interrupted build never leaves a
# directory that looks complete.
mkdir -p "$cache_root"
staging="$(mktemp -d "$cache_root/.build-XXXXXX")"
trap 'rm -rf "$staging"' EXIT

# The same version stamps upstream's hack/lib/version.sh sets; without them the components
# report v0.0.0-master, and kubectl warns about version skew.
version_pkgs=(k8s.io/component-base/version k8s.io/client-go/pkg/version)
major="${k8s_version#v}"; major="${major%%.*}"
minor="${k8s_version#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in "${version_pkgs[@]}"; do
    ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

start=$(date +%s)
# CGO off: upstream release binaries are static too, and no C toolchain is needed.
CGO_ENABLED=0 GOFLAGS=-buildvcs=false "$go_bin" build -mod=readonly -trimpath -p 2 \
    -ldflags="$ldflags" -o "$staging/" \
    ./cmd/etcd \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl
end=$(date +%s)

for b in "${binaries[@]}"; do
    [[ -x "$staging/$b" ]] || { echo "build.sh: $b was not built" >&2; exit 1; }
done
touch "$staging/.complete"
rm -rf "$out"
mv "$staging" "$out"
trap - EXIT
echo "build.sh: built in $((end - start)) s ($(du -sh "$out" | cut -f1))" >&2
echo "$out"
