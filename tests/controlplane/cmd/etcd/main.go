// Command etcd is the upstream etcd server, built from the same module version that
// k8s.io/kubernetes v1.37.2 is tested against, so tests need no downloaded etcd binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
