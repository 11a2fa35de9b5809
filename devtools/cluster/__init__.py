"""A one-node Kubernetes cluster on this machine, for trying the extender for real and for the node tier's tests
(tests/node): `make cluster` brings it up, `make cluster-down` removes it.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy at the e2e tier's version,
built from source by tests/e2e/build.sh; containerd, runc and the CNI plugins from Debian's packages; the images
the manifests need built from their sources by image/node-images.sh and imported (no registry is reachable here);
a device-plugin double of either protocol (devtools/deviceplugin) that kubelet itself calls. Everything runs in a
network namespace with no way out (network.py): the cluster's traffic never leaves the machine.

Modules: layout (names, addresses, paths), pki (credentials), network, processes (daemons), components (each
daemon's command line and configuration), clients (API, ctr, kubectl), addons (images, CoreDNS, device plugin),
node (up and down). Never imported by the extender.
"""
