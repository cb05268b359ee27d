// Package deploytest checks what deploy/ ships, with the tools its users
// run: the image with podman and buildah, the Kubernetes manifests and the
// Helm chart with Helm's own packages and the Kubernetes API types, the
// Prometheus rules with promtool, the Grafana dashboard's queries with
// Prometheus's PromQL parser against a live /metrics, and the systemd unit
// with systemd-analyze. It is a module of its own, so that idem's users
// never download Helm, Kubernetes or Prometheus.
package deploytest
