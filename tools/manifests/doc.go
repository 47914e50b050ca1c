// Package manifests checks the orders example's Kubernetes kit
// (examples/orders/k8s) and the root docker-compose.yml offline: no cluster,
// no Docker engine and no kubeconform schemas are reachable here.
//
// Every Kubernetes manifest is decoded strictly into the k8s.io/api types
// (an unknown kind, an unknown or misspelt field, a duplicate key all fail,
// naming the field), then the numbers that must agree across the files are
// checked: the grace period against preStop and the shutdown budget, the
// probes' and the scrape annotation's ports against the container's, the
// selectors against the pod template's labels, GOMEMLIMIT and the memory
// limit against MaxBufferedBytes, the session timeout when static
// membership is on. docs/operations.md ("Kubernetes") explains each.
//
// The package's tests run these checks on the repository's files, and
// check the root .dockerignore against what the orders image's build
// compiles.
package manifests
