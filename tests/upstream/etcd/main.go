// Command etcd is etcd's own server main, built from the same etcd release
// that k8s.io/kubernetes v1.37 is tested against (go.etcd.io/etcd/server/v3),
// for machines whose packaged etcd is too old for this kube-apiserver.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
