//go:build tools

// Package tools pins the two Kubernetes commands the e2e tier runs, kube-apiserver and kube-scheduler, to
// the k8s.io/kubernetes release required in go.mod (the one place the version is written); build.sh builds
// them from here. k8s.io/kubernetes is not meant to be imported, so go.mod replaces every k8s.io staging
// module (required as v0.0.0 by k8s.io/kubernetes) with its tagged release of the same version.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
