#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Static checks of the Kubernetes manifests under deploy/.

Usage: test_manifests.py --plugin BIN [--launcher BIN] [--qsdctl BIN] [--gate BIN] [--root SRC]

Checks what deploy/ installs: the output of `kubectl kustomize
deploy/kubernetes` (what `kubectl apply -k deploy/kubernetes` sends), of
`kubectl kustomize deploy/monitoring`, and every YAML document of
deploy/examples/ (the snapshot-controller component
is checked by test_schemas.py, which also validates all of these against
the API's schemas):
  * apiVersion/kind are known, and the fields each kind needs are there
    (with the values the design needs for CSIDriver, StorageClass, the node
    DaemonSet and the VM pod);
  * every --flag passed to our binaries (containers whose command is
    qsd-csi-plugin or qsd-vm-launcher) appears in that binary's --help, and
    the binary itself accepts the whole argument list (run with --version
    appended, which both binaries handle inside their option loop); every
    flag passed to an upstream sidecar is one that sidecar has
    (SIDECAR_FLAGS, taken from the sidecars' sources);
  * the sidecars: each at the release in SIDECAR_RELEASES (the latest, per
    their release notes), with the flags this deployment needs, privileged
    (SELinux: the socket is the privileged plugin's); the RBAC granted to
    the node ServiceAccount is exactly SIDECAR_RBAC (what each sidecar's
    own rbac.yaml asks for in the mode it runs in: nothing missing, nothing
    more); the plugin mounts kubelet's pods/ and plugins/ (not the whole
    root), no privileged init container, a PriorityClass usable outside
    kube-system, one port per endpoint, the plugin's --http-endpoint on the
    container port "metrics"; each PodMonitor of deploy/monitoring selects
    a DaemonSet or Deployment of its namespace that has the container port it
    scrapes; the PrometheusRule's alerts have an expression, a severity and
    a summary (tests/monitoring/ tests the expressions), the dashboard
    ConfigMap carries grafana_dashboard and valid JSON;
  * consistency: the driver name (CSIDriver == StorageClass provisioner ==
    VolumeSnapshotClass driver == plugin --driver-name == inline CSI volumes
    == registrar path), the CSI socket seen by the plugin, the registrar and
    every sidecar is the same host file, StorageClass parameters are the ones
    documented in docs/storageclass.md, each maps to a qsdctl option that
    exists and accepts the documented values;
  * the VM pod: no privilege, bridge volume and PVC mounts where the launcher
    looks (--volumes-dir, repeatable: the bridge, and beside it the
    directory of the PVC mounts; nothing mounted inside the bridge, both
    read-only, no disk name twice), the VM description in the ConfigMap
    parses; with --launcher, the launcher itself builds a domain from it
    (--dry-run, fake volumes in the same directories);
  * the node endpoint (docs/node-operations.md): qsd-node-gate in both
    workloads starts as root with exactly GATE_CAPS (everything else
    dropped, no escalation, read-only root, RuntimeDefault) and confines
    itself to a non-root --uid/--gid; the serve gate listens on the
    downward API's status.hostIP at a container port of its own and
    forwards to the plugin's --node-ops-endpoint, whose --node-ops-group is
    its --gid; the dial gate serves the plugin's --node-dial socket with
    the plugin's group, reaches the API server by KUBERNETES_SERVICE_* and
    the ServiceAccount's CA; each socket's emptyDir and each key Secret is
    mounted by those containers alone, the Secrets read-only and 0400-ish;
    the port dialled is the port listened on; the controller may get Nodes;
  * attachment pods (an inline volume with hotplugInto): the VM pod they
    name exists in their namespace with a bridge, same fsGroup, on its node
    (podAffinity or nodeName), nothing privileged, no token, their PVCs exist
    and every volume is mounted (kubelet publishes only mounted volumes).

Before checking deploy/, it checks itself: a copy of the manifests with a
bogus plugin flag (and one with a mismatched driver name) must be rejected.
Exit 0: all good; 1: problems (listed); 77: cannot run (no PyYAML, or
no kubectl: no reachable registry ships it, the machine images have it).
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed")
    sys.exit(77)

import render



class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last
    one silently; the API server's strict decoding does not)."""


def _no_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, "duplicate key %r" % (key,), key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)

KUSTOMIZATION = "deploy/kubernetes"
MONITORING = "deploy/monitoring"
EXAMPLES = "deploy/examples"
DRIVER_DEFAULT = "qsd.csi.qsd-csi.dev"
TOPOLOGY_KEY = "topology.qsd.csi.qsd-csi.dev/node"
# The VM pods' seccomp profile: the file in the plugin image, its name under
# kubelet's seccomp directory, what it must allow (passt's own sandbox: user,
# mount and network namespaces) and what it must still refuse.
SECCOMP_FILE = "deploy/images/plugin/vm-launcher-seccomp.json"
SECCOMP_VM = {"type": "Localhost", "localhostProfile": "qsd-csi/vm-launcher.json"}
SECCOMP_MUST_ALLOW = {"unshare", "mount", "umount2", "pivot_root", "setns", "read", "write",
                      "ioctl", "mmap", "clone", "execve"}
SECCOMP_MUST_REFUSE = {"bpf", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
                       "init_module", "finit_module", "delete_module", "perf_event_open",
                       "open_by_handle_at", "userfaultfd", "reboot", "swapon", "swapoff",
                       "io_uring_setup", "fsopen", "move_mount", "open_tree", "clone3"}

# kind -> apiVersion, namespaced?
KINDS = {
    "Namespace": ("v1", False),
    "ServiceAccount": ("v1", True),
    "ConfigMap": ("v1", True),
    "Secret": ("v1", True),
    "Service": ("v1", True),
    "PersistentVolumeClaim": ("v1", True),
    "Pod": ("v1", True),
    "DaemonSet": ("apps/v1", True),
    "Deployment": ("apps/v1", True),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", False),
    "Role": ("rbac.authorization.k8s.io/v1", True),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", True),
    "CSIDriver": ("storage.k8s.io/v1", False),
    "StorageClass": ("storage.k8s.io/v1", False),
    "VolumeAttributesClass": ("storage.k8s.io/v1", False),
    "VolumeSnapshotClass": ("snapshot.storage.k8s.io/v1", False),
    "VolumeGroupSnapshotClass": ("groupsnapshot.storage.k8s.io/v1", False),
    "PriorityClass": ("scheduling.k8s.io/v1", False),
    "PodMonitor": ("monitoring.coreos.com/v1", True),
    "PrometheusRule": ("monitoring.coreos.com/v1", True),
}

# Upstream sidecars: image name -> flags that release accepts (from
# cmd/*/main.go of node-driver-registrar v2.x, livenessprobe v2.x,
# external-provisioner v6.x, external-resizer v2.x, external-snapshotter
# v8.x; klog/component-base logging flags are in COMMON_FLAGS).
COMMON_FLAGS = {"v", "vmodule", "logging-format", "log-flush-frequency", "version"}
SIDECAR_FLAGS = {
    "csi-node-driver-registrar": {
        "csi-address", "kubelet-registration-path", "plugin-registration-path", "timeout",
        "connection-timeout", "health-port", "http-endpoint", "mode", "enable-pprof"},
    "livenessprobe": {
        "csi-address", "probe-timeout", "health-port", "http-endpoint", "metrics-address",
        "metrics-path"},
    "csi-provisioner": {
        "csi-address", "kubeconfig", "master", "volume-name-prefix", "volume-name-uuid-length",
        "retry-interval-start", "retry-interval-max", "worker-threads",
        "cloning-protection-threads", "capacity-threads", "timeout", "leader-election",
        "leader-election-namespace", "leader-election-lease-duration",
        "leader-election-renew-deadline", "leader-election-retry-period", "strict-topology",
        "immediate-topology", "extra-create-metadata", "metrics-address", "http-endpoint",
        "metrics-path", "enable-pprof", "default-fstype", "kube-api-qps", "kube-api-burst",
        "kube-api-capacity-qps", "kube-api-capacity-burst", "enable-capacity",
        "capacity-for-immediate-binding", "capacity-poll-interval", "capacity-ownerref-level",
        "node-deployment", "node-deployment-immediate-binding", "node-deployment-base-delay",
        "node-deployment-max-delay", "controller-publish-readonly",
        "prevent-volume-mode-conversion", "feature-gates",
        # v6.3.0 (#1519)
        "snapshot-orphan-sweep-interval"},
    "csi-resizer": {
        "csi-address", "kubeconfig", "master", "resync-period", "workers",
        "extra-modify-metadata", "timeout", "retry-interval-start", "retry-interval-max",
        "leader-election", "leader-election-namespace", "leader-election-lease-duration",
        "leader-election-renew-deadline", "leader-election-retry-period", "metrics-address",
        "http-endpoint", "metrics-path", "kube-api-qps", "kube-api-burst",
        "handle-volume-inuse-error", "feature-gates",
        # v2.3.0 (#596)
        "resize-timeout", "modify-timeout"},
    "csi-snapshotter": {
        "csi-address", "kubeconfig", "resync-period", "snapshot-name-prefix",
        "snapshot-name-uuid-length", "worker-threads", "timeout", "extra-create-metadata",
        "leader-election", "leader-election-namespace", "leader-election-lease-duration",
        "leader-election-renew-deadline", "leader-election-retry-period", "kube-api-qps",
        "kube-api-burst", "metrics-address", "http-endpoint", "metrics-path",
        "retry-interval-start", "retry-interval-max", "node-deployment",
        "groupsnapshot-name-prefix", "groupsnapshot-name-uuid-length", "feature-gates"},
    # external-snapshot-metadata v1.1.0, pkg/sidecar/sidecar.go
    # (components/snapshot-metadata).
    "csi-snapshot-metadata": {
        "csi-address", "timeout", "port", "http-endpoint", "kube-api-burst", "kube-api-qps",
        "kubeconfig", "max-streaming-duration-min", "metrics-path", "tls-cert", "tls-key",
        "audience", "disable-metrics"},
}
SIDECAR_IMAGE = re.compile(r"^registry\.k8s\.io/sig-storage/([a-z-]+):(v\d+\.\d+\.\d+)$")

# The latest release of each sidecar (their CHANGELOG/ files), and why it
# matters here.  kustomization.yaml sets the tags.
SIDECAR_RELEASES = {
    "csi-node-driver-registrar": "v2.17.0",  # CVE-2026-33186 fixed
    "livenessprobe": "v2.20.0",              # v2.19.0 CVE fixes; Kubernetes 1.37 deps
    "csi-provisioner": "v6.4.0",             # volume leak after timeouts fixed;
                                             # v6.3.0 orphaned source-protection sweeper
    "csi-resizer": "v2.3.0",                 # CVE-2026-42508 fixed
    "csi-snapshotter": "v8.7.0",             # v8.6.0 deletion race; v8.7.0 Go CVEs
    "csi-snapshot-metadata": "v1.1.0",       # SnapshotMetadataService v1beta1
}
# Flags each sidecar must have in the node DaemonSet (flag -> value, None:
# any value).  The resizer is not there: one resizer, in the controller.
SIDECAR_REQUIRED_FLAGS = {
    "csi-node-driver-registrar": {"csi-address": None, "kubelet-registration-path": None,
                                  "http-endpoint": None},
    "livenessprobe": {"csi-address": None, "http-endpoint": None},
    "csi-provisioner": {"csi-address": None, "node-deployment": "true",
                        "leader-election": "false", "feature-gates": "Topology=true",
                        "strict-topology": "true", "enable-capacity": "true",
                        "capacity-ownerref-level": "1", "http-endpoint": None},
}
# ...and in the controller Deployment: central mode, leader election.
CONTROLLER_SIDECAR_FLAGS = {
    "livenessprobe": {"csi-address": None, "http-endpoint": None},
    "csi-provisioner": {"csi-address": None, "leader-election": "true",
                        "leader-election-namespace": None, "http-endpoint": None},
    # Without it the resizer lists and watches every pod in the cluster
    # (and its RBAC must allow that), to retry in-use errors the plugin never
    # returns.
    "csi-resizer": {"csi-address": None, "leader-election": "true",
                    "leader-election-namespace": None,
                    "handle-volume-inuse-error": "false", "http-endpoint": None},
    "csi-snapshotter": {"csi-address": None, "leader-election": "true",
                        "leader-election-namespace": None, "http-endpoint": None},
    # The TLS pair of scripts/snapshot-metadata-certs.sh; the port the
    # Service and the SnapshotMetadataService address name.
    "csi-snapshot-metadata": {"csi-address": None, "port": "9829", "http-endpoint": ":9828",
                              "tls-cert": None, "tls-key": None},
}
# Flags of the node mode the central sidecars must not have.
NODE_ONLY_FLAGS = {"node-deployment", "node-deployment-immediate-binding", "enable-capacity",
                   "capacity-ownerref-level"}
# What each ServiceAccount may do: the rules each sidecar's own
# deploy/kubernetes/rbac.yaml asks for at the release above, in the mode it
# runs in here, as (apiGroup, resource, verb) -> why.  Granted rules must be
# exactly these (nothing missing, nothing more); a namespace of None is a
# ClusterRole, "ns" the DaemonSet's namespace (a Role).
def _rules(ns, group, resources, verbs, why):
    return {(ns, group, r, v): why for r in resources for v in verbs}


# csi-provisioner v6.4 in both modes.
_PROVISIONER_RBAC = [
    _rules(None, "", ["persistentvolumes"],
           ["get", "list", "watch", "create", "patch", "delete"], "csi-provisioner"),
    _rules(None, "", ["persistentvolumeclaims"], ["get", "list", "watch", "update"],
           "csi-provisioner"),
    _rules(None, "storage.k8s.io", ["storageclasses", "volumeattributesclasses"],
           ["get", "list", "watch"], "csi-provisioner"),
    _rules(None, "", ["events"], ["list", "watch", "create", "update", "patch"],
           "csi-provisioner, csi-resizer, csi-snapshotter"),
    _rules(None, "snapshot.storage.k8s.io", ["volumesnapshots"],
           ["get", "list", "watch", "update"],
           "csi-provisioner (restore; watch/update: snapshot source protection, v6.1.1)"),
    _rules(None, "snapshot.storage.k8s.io", ["volumesnapshotcontents"], ["get", "list"],
           "csi-provisioner (restore)")]
SIDECAR_RBAC = {}   # the node DaemonSet's
for _r in _PROVISIONER_RBAC + [
        # csi-provisioner v6.4 per node (--node-deployment, --enable-capacity, Topology)
        _rules(None, "storage.k8s.io", ["csinodes"], ["get", "list", "watch"],
               "csi-provisioner"),
        _rules(None, "", ["nodes"], ["get", "list", "watch"], "csi-provisioner (topology)"),
        _rules("ns", "storage.k8s.io", ["csistoragecapacities"],
               ["get", "list", "watch", "create", "update", "patch", "delete"],
               "csi-provisioner (--enable-capacity)"),
        _rules("ns", "", ["pods"], ["get"], "csi-provisioner (--capacity-ownerref-level)"),
        _rules("ns", "apps", ["daemonsets"], ["get"], "csi-provisioner (--capacity-ownerref-level=1)")]:
    SIDECAR_RBAC.update({k: SIDECAR_RBAC.get(k, v) for k, v in _r.items()})
# csi-snapshotter v8.7, central (the controller Deployment), with its
# group-snapshot controller (the controller role serves the GroupController
# with --node-dial).
_SNAPSHOTTER_RBAC = [
    _rules(None, "", ["events"], ["list", "watch", "create", "update", "patch"],
           "csi-snapshotter"),
    _rules(None, "snapshot.storage.k8s.io", ["volumesnapshotclasses"],
           ["get", "list", "watch"], "csi-snapshotter"),
    _rules(None, "snapshot.storage.k8s.io", ["volumesnapshotcontents"],
           ["get", "list", "watch", "update", "patch"], "csi-snapshotter"),
    _rules(None, "snapshot.storage.k8s.io", ["volumesnapshotcontents/status"],
           ["update", "patch"], "csi-snapshotter"),
    _rules(None, "groupsnapshot.storage.k8s.io", ["volumegroupsnapshotclasses"],
           ["get", "list", "watch"], "csi-snapshotter (group snapshots)"),
    _rules(None, "groupsnapshot.storage.k8s.io", ["volumegroupsnapshotcontents"],
           ["get", "list", "watch", "update", "patch"], "csi-snapshotter (group snapshots)"),
    _rules(None, "groupsnapshot.storage.k8s.io", ["volumegroupsnapshotcontents/status"],
           ["update", "patch"], "csi-snapshotter (group snapshots)")]
CONTROLLER_RBAC = {}  # the controller Deployment's
# csi-provisioner central: no capacity, no topology (the controller role
# reports none: no Nodes, no CSINodes).
for _r in _PROVISIONER_RBAC + [
        _rules(None, "", ["secrets"], ["get"],
               "csi-provisioner, csi-resizer, csi-snapshotter (the classes' *-secret-name)"),
        # csi-resizer v2.3 (--handle-volume-inuse-error=false: no pods)
        _rules(None, "", ["persistentvolumes"], ["get", "list", "watch", "patch"], "csi-resizer"),
        _rules(None, "", ["persistentvolumeclaims"], ["get", "list", "watch"], "csi-resizer"),
        _rules(None, "", ["persistentvolumeclaims/status"], ["patch"], "csi-resizer"),
        _rules(None, "storage.k8s.io", ["volumeattributesclasses"], ["get", "list", "watch"],
               "csi-resizer"),
        _rules("ns", "coordination.k8s.io", ["leases"], ["get", "create", "update"],
               "csi-provisioner, csi-resizer, csi-snapshotter (leader election)"),
        # the plugin: a volume's node to its InternalIP (the node endpoint)
        _rules(None, "", ["nodes"], ["get"], "the controller plugin (node endpoint address)"),
        # csi-snapshot-metadata v1.1.0 (components/snapshot-metadata): its
        # callers' tokens and rights, the SnapshotMetadataService's audience;
        # the VolumeSnapshots, contents and classes it reads are the
        # provisioner's and snapshotter's rules already.
        _rules(None, "authentication.k8s.io", ["tokenreviews"], ["create"],
               "csi-snapshot-metadata"),
        _rules(None, "authorization.k8s.io", ["subjectaccessreviews"], ["create"],
               "csi-snapshot-metadata"),
        _rules(None, "cbt.storage.k8s.io", ["snapshotmetadataservices"],
               ["get", "list", "watch"], "csi-snapshot-metadata")] + \
        _SNAPSHOTTER_RBAC:
    CONTROLLER_RBAC.update({k: CONTROLLER_RBAC.get(k, v) for k, v in _r.items()})
WORKLOAD_RBAC = {"DaemonSet": SIDECAR_RBAC, "Deployment": CONTROLLER_RBAC}
# StorageClass parameters of backend rbd (docs/rbd.md) and the secrets such
# a class must name (each with -name and -namespace).
RBD_PARAMS = {"backend", "clusterID", "pool", "radosNamespace"}
RBD_SECRETS = ("provisioner", "controller-expand", "node-stage")
RBD_SECRET_KEYS = {"userID", "userKey"}
# Cluster-scoped kinds kustomize does not know (custom resources): its
# `namespace:` sets their metadata.namespace, which the API server clears
# for cluster-scoped objects.
KUSTOMIZE_UNKNOWN_CLUSTER_SCOPED = {"VolumeSnapshotClass"}
# Priority classes the API server restricts to kube-system on some clusters.
SYSTEM_PRIORITY = {"system-node-critical", "system-cluster-critical"}
# The attachment pod's container (it only holds volumes).
PAUSE_IMAGE = re.compile(r"^registry\.k8s\.io/pause:\d+\.\d+$")
# Flags of our binaries that may be given more than once (values: a list).
REPEATABLE_FLAGS = {"volumes-dir"}
# Our binaries (a container runs one by its command) and our images.
OUR_BINARIES = ("qsd-csi-plugin", "qsd-vm-launcher", "qsd-node-gate")
OUR_IMAGES = ("qsd-csi-plugin", "qsd-vm-launcher")

# The node endpoint (docs/node-operations.md, "The endpoint"): qsd-node-gate
# in the node DaemonSet (serve mode) and in the controller Deployment
# (--dial).  It starts as root and confines itself (qsdctl/gate_main.c
# confine(), qsdctl/lib/qsd/base/confine.c): unshare(CLONE_NEWNS), mount,
# umount2, mount_setattr need SYS_ADMIN, PR_CAPBSET_DROP SETPCAP, setgroups
# and setresgid SETGID, setresuid SETUID; nothing else (its keys are read as
# their owner, its port is unprivileged).
GATE = "qsd-node-gate"
GATE_CAPS = {"SETUID", "SETGID", "SETPCAP", "SYS_ADMIN"}
NODE_TLS_SECRET = "qsd-csi-node-tls"
CONTROLLER_TLS_SECRET = "qsd-csi-controller-tls"
NODE_PEER = "qsd-csi-node"              # the nodes' certificate (scripts/node-certs.sh)
CONTROLLER_PEER = "qsd-csi-controller"  # the controller's
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Flags the manifests pass that the C side, written alongside (issue 25),
# has not landed yet: checked against --help once they are there (and then
# an error here until removed from this list), left out of the binaries'
# own parse until then.
PENDING_FLAGS = {}
# What kubelet fills in, as sample values, so that the binaries can parse
# the arguments (the downward API's fieldRefs; the kubernetes Service's
# variables, which kubelet sets in every container).
SAMPLE_FIELDS = {"status.hostIP": "192.0.2.10"}
SAMPLE_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}

# StorageClass parameter -> (qsdctl subcommand, option).  The allowed values
# come from docs/storageclass.md and must each appear in the option's line of
# `qsdctl SUBCOMMAND --help`.
PARAM_OPTION = {
    "format": ("create", "--format"),
    "preallocation": ("create", "--preallocation"),
    "cache": ("export", "--cache"),
    "aio": ("export", "--aio"),
    "numQueues": ("export", "--num-queues"),
    "logicalBlockSize": ("export", "--logical-block-size"),
    "discard": ("export", "--discard"),
    "detectZeroes": ("export", "--detect-zeroes"),
}
# Image class parameters (the plugin's own, no qsdctl option): value patterns.
IMAGE_PARAMS = {
    "image": re.compile(r"^https?://[!-~]{1,2040}$"),
    "imageSha256": re.compile(r"^[0-9a-f]{64}$"),
    "imageSha512": re.compile(r"^[0-9a-f]{128}$"),
}


class Checker:
    def __init__(self, root, helps, launcher=None, qsdctl_help=None, quiet=False, paths=None):
        self.root = root
        self.paths = paths or {}      # binary name -> path, to run it
        self.helps = helps            # binary name -> set of flags
        self.help_text = {}
        self.launcher = launcher
        self.qsdctl_help = qsdctl_help or {}
        self.errors = []
        self.notes = []
        self.quiet = quiet
        self.docs = []                # (file, index, doc)

    def err(self, where, msg):
        self.errors.append("%s: %s" % (where, msg))

    def note(self, msg):
        self.notes.append(msg)

    # ------------------------------------------------------------ loading
    def load(self):
        """deploy/kubernetes and deploy/monitoring as kustomize renders them;
        deploy/examples as files."""
        for rel in (KUSTOMIZATION, MONITORING):
            self.load_kustomization(rel)
        files = []
        for d, _, names in os.walk(os.path.join(self.root, EXAMPLES)):
            for n in names:
                if n.endswith((".yaml", ".yml")):
                    files.append(os.path.join(d, n))
        if not files:
            self.err(EXAMPLES, "no YAML files")
        for f in sorted(files):
            rel = os.path.relpath(f, self.root)
            try:
                with open(f) as fh:
                    docs = list(yaml.load_all(fh, Loader=StrictLoader))
            except yaml.YAMLError as e:
                self.err(rel, "YAML does not parse: %s" % " ".join(str(e).split()))
                continue
            for i, doc in enumerate(docs):
                if doc is None:
                    continue
                if not isinstance(doc, dict):
                    self.err("%s#%d" % (rel, i), "document is not a mapping")
                    continue
                self.docs.append((rel, i, doc))

    def load_kustomization(self, rel):
        kdir = os.path.join(self.root, rel)
        try:
            with open(os.path.join(kdir, "kustomization.yaml")) as fh:
                listed = set((yaml.safe_load(fh) or {}).get("resources") or [])
            for n in sorted(os.listdir(kdir)):
                if n.endswith((".yaml", ".yml")) and n != "kustomization.yaml" and n not in listed:
                    self.err("%s/kustomization.yaml" % rel,
                             "%s is not in resources: `kubectl apply -k` would skip it" % n)
            # deploy/kubernetes: with its optional components (all of them).
            docs = (render.kustomize_all(kdir) if os.path.isdir(os.path.join(kdir, "components"))
                    else render.kustomize(kdir))
            for i, doc in enumerate(docs):
                self.docs.append(("%s (kustomize)" % rel, i, doc))
        except (OSError, yaml.YAMLError, render.RenderError) as e:
            self.err(rel, str(e))

    def of_kind(self, kind):
        return [(f, i, d) for f, i, d in self.docs if d.get("kind") == kind]

    # ------------------------------------------------------- generic shape
    def check_shapes(self):
        seen = set()
        for f, i, d in self.docs:
            where = "%s#%d" % (f, i)
            kind, api = d.get("kind"), d.get("apiVersion")
            if kind not in KINDS:
                self.err(where, "unknown kind %r" % kind)
                continue
            want_api, namespaced = KINDS[kind]
            if api != want_api:
                self.err(where, "%s: apiVersion %r, expected %r" % (kind, api, want_api))
            md = d.get("metadata") or {}
            name = md.get("name")
            if not name:
                self.err(where, "%s without metadata.name" % kind)
                continue
            where = "%s %s" % (kind, name)
            if namespaced and not md.get("namespace"):
                self.err(where, "namespaced kind without metadata.namespace")
            if not namespaced and md.get("namespace"):
                if kind in KUSTOMIZE_UNKNOWN_CLUSTER_SCOPED and f.endswith("(kustomize)"):
                    self.note("%s: kustomize sets metadata.namespace on a cluster-scoped kind it "
                              "does not know; the API server drops it" % where)
                else:
                    self.err(where, "cluster-scoped kind with metadata.namespace")
            key = (kind, md.get("namespace"), name)
            if key in seen:
                self.err(where, "defined twice")
            seen.add(key)
            getattr(self, "shape_" + kind, lambda w, x: None)(where, d)

    def shape_PodMonitor(self, where, d):
        """It selects the pods of a DaemonSet or Deployment of its namespaces
        and scrapes container ports they have."""
        spec = d.get("spec") or {}
        want = (spec.get("selector") or {}).get("matchLabels") or {}
        nss = ((spec.get("namespaceSelector") or {}).get("matchNames") or
               [(d.get("metadata") or {}).get("namespace")])
        if not want:
            self.err(where, "no selector.matchLabels")
            return
        pods = [w for kind in ("DaemonSet", "Deployment") for _, _, w in self.of_kind(kind)
                if (w.get("metadata") or {}).get("namespace") in nss and
                want.items() <= ((w["spec"]["template"].get("metadata") or {})
                                 .get("labels") or {}).items()]
        if not pods:
            self.err(where, "selects no DaemonSet or Deployment of namespace %s (labels %s)"
                     % ("/".join(map(str, nss)), want))
        eps = spec.get("podMetricsEndpoints") or []
        if not eps:
            self.err(where, "no podMetricsEndpoints")
        for ep in eps:
            for w in pods:
                ports = {p.get("name") for c in w["spec"]["template"]["spec"]["containers"]
                         for p in c.get("ports") or []}
                if ep.get("port") not in ports:
                    self.err(where, "port %r: no container port of that name in %s %s" %
                             (ep.get("port"), w["kind"], w["metadata"]["name"]))

    def shape_PrometheusRule(self, where, d):
        names = set()
        groups = (d.get("spec") or {}).get("groups") or []
        if not groups:
            self.err(where, "no groups")
        for g in groups:
            for r in g.get("rules") or []:
                name = r.get("alert") or r.get("record")
                if not name or not str(r.get("expr") or "").strip():
                    self.err(where, "rule without a name or an expression: %r" % r)
                    continue
                if "alert" in r:
                    if name in names:
                        self.err(where, "alert %s twice" % name)
                    names.add(name)
                    if (r.get("labels") or {}).get("severity") not in ("critical", "warning",
                                                                      "info"):
                        self.err(where, "alert %s: severity not critical, warning or info"
                                 % name)
                    if not (r.get("annotations") or {}).get("summary"):
                        self.err(where, "alert %s: no summary annotation" % name)

    def shape_ConfigMap(self, where, d):
        """A Grafana dashboard (label grafana_dashboard) holds valid JSON."""
        if "grafana_dashboard" not in ((d.get("metadata") or {}).get("labels") or {}):
            return
        data = d.get("data") or {}
        if not data:
            self.err(where, "a dashboard ConfigMap without data")
        for k, v in data.items():
            try:
                dash = json.loads(v)
            except ValueError as e:
                self.err(where, "%s is not JSON: %s" % (k, e))
                continue
            exprs = [t.get("expr") for p in dash.get("panels") or []
                     for t in p.get("targets") or []]
            if not exprs or not all(exprs):
                self.err(where, "%s: a dashboard whose panels have no queries" % k)

    def shape_ClusterRole(self, where, d):
        rules = d.get("rules")
        if not rules:
            self.err(where, "no rules")
        for r in rules or []:
            for k in ("apiGroups", "resources", "verbs"):
                if not isinstance(r.get(k), list) or (k != "apiGroups" and not r[k]):
                    self.err(where, "rule without %s: %r" % (k, r))

    shape_Role = shape_ClusterRole

    def shape_ClusterRoleBinding(self, where, d):
        ref = d.get("roleRef") or {}
        if ref.get("apiGroup") != "rbac.authorization.k8s.io" or not ref.get("name") or \
                ref.get("kind") not in ("Role", "ClusterRole"):
            self.err(where, "bad roleRef %r" % ref)
        if not d.get("subjects"):
            self.err(where, "no subjects")
        ns = (d.get("metadata") or {}).get("namespace")
        if ref.get("kind") and not self.find(ref["kind"], ref.get("name"),
                                             ns if ref["kind"] == "Role" else None):
            self.err(where, "roleRef %s %s is not defined in deploy/" % (ref["kind"], ref.get("name")))
        for s in d.get("subjects") or []:
            if s.get("kind") == "ServiceAccount":
                if not s.get("namespace") and d["kind"] == "ClusterRoleBinding":
                    self.err(where, "ServiceAccount subject without namespace")
                if not self.find("ServiceAccount", s.get("name"), s.get("namespace") or ns):
                    self.err(where, "subject ServiceAccount %s/%s is not defined" %
                             (s.get("namespace"), s.get("name")))

    shape_RoleBinding = shape_ClusterRoleBinding

    def shape_CSIDriver(self, where, d):
        spec = d.get("spec") or {}
        # The RBD name (the plugin's --rbd-driver-name): persistent RBD
        # volumes only, no node capacity.  The local name: capacity per
        # node, and the inline bridge volumes.
        rbd = d["metadata"]["name"] in self.rbd_driver_names()
        want = {"attachRequired": False, "podInfoOnMount": True, "fsGroupPolicy": "File",
                "storageCapacity": not rbd}
        for k, v in want.items():
            if spec.get(k) != v:
                self.err(where, "spec.%s is %r, the design needs %r" % (k, spec.get(k), v))
        modes = ["Persistent"] if rbd else ["Ephemeral", "Persistent"]
        if sorted(spec.get("volumeLifecycleModes") or []) != modes:
            self.err(where, "spec.volumeLifecycleModes must be %s" % " and ".join(modes))

    def shape_StorageClass(self, where, d):
        if not d.get("provisioner"):
            self.err(where, "no provisioner")
        params = d.get("parameters") or {}
        if params.get("backend") == "rbd":
            # The controller's provisioner takes Immediate claims; with
            # WaitForFirstConsumer the node's would create the image too.
            if d.get("volumeBindingMode") != "Immediate":
                self.err(where, "volumeBindingMode must be Immediate (RBD volumes: the "
                         "controller Deployment provisions them, the node provisioners take "
                         "only WaitForFirstConsumer claims)")
        elif d.get("volumeBindingMode") != "WaitForFirstConsumer":
            self.err(where, "volumeBindingMode must be WaitForFirstConsumer (node-local volumes)")
        for k, v in params.items():
            if not isinstance(v, str):
                self.err(where, "parameter %s: value %r is not a string (quote it)" % (k, v))

    def shape_VolumeSnapshotClass(self, where, d):
        if not d.get("driver"):
            self.err(where, "no driver")
        if d.get("deletionPolicy") not in ("Delete", "Retain"):
            self.err(where, "deletionPolicy must be Delete or Retain")

    def shape_VolumeGroupSnapshotClass(self, where, d):
        self.shape_VolumeSnapshotClass(where, d)

    def shape_PersistentVolumeClaim(self, where, d):
        spec = d.get("spec") or {}
        if not spec.get("accessModes"):
            self.err(where, "no accessModes")
        if not ((spec.get("resources") or {}).get("requests") or {}).get("storage"):
            self.err(where, "no resources.requests.storage")
        sc = spec.get("storageClassName")
        if not sc or not self.find("StorageClass", sc):
            self.err(where, "storageClassName %r is not a StorageClass in deploy/" % sc)

    def shape_ConfigMap(self, where, d):
        if not d.get("data") and not d.get("binaryData"):
            self.err(where, "no data")

    def shape_DaemonSet(self, where, d):
        spec = d.get("spec") or {}
        sel = (spec.get("selector") or {}).get("matchLabels") or {}
        tmpl = spec.get("template") or {}
        labels = (tmpl.get("metadata") or {}).get("labels") or {}
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            self.err(where, "selector.matchLabels do not match the template's labels")
        self.check_podspec(where, tmpl.get("spec") or {}, d["metadata"]["namespace"])

    shape_Deployment = shape_DaemonSet

    def shape_Pod(self, where, d):
        self.check_podspec(where, d.get("spec") or {}, d["metadata"]["namespace"])

    def find(self, kind, name, namespace=None):
        for _, _, d in self.of_kind(kind):
            md = d.get("metadata") or {}
            if md.get("name") == name and (namespace is None or md.get("namespace") == namespace):
                return d
        return None

    def check_podspec(self, where, spec, namespace):
        containers = spec.get("containers") or []
        if not containers:
            self.err(where, "no containers")
        vols = {v.get("name"): v for v in spec.get("volumes") or []}
        sa = spec.get("serviceAccountName")
        if sa and not self.find("ServiceAccount", sa, namespace):
            self.err(where, "serviceAccountName %s is not defined" % sa)
        names = set()
        for c in containers + (spec.get("initContainers") or []):
            cw = "%s container %s" % (where, c.get("name"))
            if not c.get("name") or not c.get("image"):
                self.err(cw, "container without name or image")
            if c.get("name") in names:
                self.err(cw, "duplicate container name")
            names.add(c.get("name"))
            for m in c.get("volumeMounts") or []:
                if m.get("name") not in vols:
                    self.err(cw, "volumeMount %s has no volume" % m.get("name"))
                if not str(m.get("mountPath", "")).startswith("/"):
                    self.err(cw, "volumeMount %s: mountPath not absolute" % m.get("name"))
            for p in ("livenessProbe", "readinessProbe"):
                probe = c.get(p)
                if probe and "httpGet" in probe:
                    port = probe["httpGet"].get("port")
                    if isinstance(port, str) and port not in \
                            [x.get("name") for x in (c.get("ports") or [])]:
                        self.err(cw, "%s uses port %r the container does not declare" % (p, port))

    # --------------------------------------------------------- containers
    def all_containers(self):
        """(where, podspec, container, owner doc) for every container."""
        out = []
        for f, i, d in self.docs:
            if d.get("kind") in ("DaemonSet", "Deployment"):
                spec = ((d.get("spec") or {}).get("template") or {}).get("spec") or {}
            elif d.get("kind") == "Pod":
                spec = d.get("spec") or {}
            else:
                continue
            for init in (False, True):
                for c in spec.get("initContainers" if init else "containers") or []:
                    out.append(("%s %s %scontainer %s" % (
                        d["kind"], d["metadata"].get("name"), "init" if init else "",
                        c.get("name")), spec, c, d))
        return out

    @staticmethod
    def expand(value, c, sample=False):
        """$(VAR) of the container's env; with sample, also what kubelet fills
        in (SAMPLE_FIELDS, SAMPLE_ENV) as sample values."""
        env = {}
        for e in c.get("env") or []:
            field = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if "value" in e:
                env[e.get("name")] = e["value"]
            elif sample and field in SAMPLE_FIELDS:
                env[e.get("name")] = SAMPLE_FIELDS[field]
        if sample:
            for k, v in SAMPLE_ENV.items():
                env.setdefault(k, v)
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                      lambda m: env.get(m.group(1), m.group(0)), value)

    def parse_args(self, where, c):
        """--name[=value] list -> dict name -> value (None for no value)."""
        args = [str(a) for a in (c.get("args") or [])] + \
            [str(a) for a in (c.get("command") or [])[1:]]
        out, prev = {}, None
        for a in args:
            if a.startswith("--"):
                name, eq, val = a[2:].partition("=")
                if not re.match(r"^[a-z0-9][a-z0-9-]*$", name):
                    self.err(where, "malformed flag %r" % a)
                if name in REPEATABLE_FLAGS:
                    out.setdefault(name, [])
                    if eq:
                        out[name].append(self.expand(val, c))
                    prev = None if eq else name
                    continue
                if name in out:
                    self.err(where, "flag --%s given twice" % name)
                out[name] = self.expand(val, c) if eq else None
                prev = None if eq else name
            elif a.startswith("-"):
                self.err(where, "short flag %r: use the --long form" % a)
                prev = None
            elif prev is not None:
                if prev in REPEATABLE_FLAGS:
                    out[prev].append(self.expand(a, c))
                else:
                    out[prev] = self.expand(a, c)
                prev = None
            else:
                self.err(where, "stray argument %r" % a)
        return out

    def parse_with_binary(self, where, b, c):
        """Let the binary parse the manifest's arguments: both binaries handle
        --version inside their option loop, so ARGS... --version exits 0 once
        every earlier option (and its value, e.g. --log-level) was accepted."""
        pending = PENDING_FLAGS.get(b, set())
        args = [self.expand(str(a), c, sample=True)
                for a in [*(c.get("command") or [])[1:], *(c.get("args") or [])]
                if not (str(a).startswith("--") and str(a)[2:].partition("=")[0] in pending)]
        try:
            p = subprocess.run([self.paths[b]] + args + ["--version"], capture_output=True,
                               text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.err(where, "cannot run %s: %s" % (b, e))
            return
        if p.returncode != 0:
            self.err(where, "%s refuses the manifest's arguments (exit %d): %s" %
                     (b, p.returncode, (p.stderr or p.stdout).strip()[:300]))

    def binary_of(self, c):
        cmd = c.get("command") or []
        return os.path.basename(str(cmd[0])) if cmd else None

    def check_containers(self):
        for where, spec, c, owner in self.all_containers():
            image = str(c.get("image", ""))
            binary = self.binary_of(c)
            m = SIDECAR_IMAGE.match(image)
            ours = [i for i in OUR_IMAGES if i in image]
            if binary in OUR_BINARIES or ours:
                if binary not in OUR_BINARIES:
                    if binary and " initcontainer " in where:
                        # A helper command from our image (e.g. mkdir).
                        continue
                    self.err(where, "runs %s: give command: [/path/to/%s] explicitly" %
                             (ours[0], ours[0]))
                    continue
                b = binary
                if b == GATE and "qsd-csi-plugin" not in image:
                    self.err(where, "qsd-node-gate is in the plugin image, not in %s" % image)
                flags = self.parse_args(where, c)
                if b not in self.helps:
                    self.note("%s: %s --help not available, its flags were not checked" %
                              (where, b))
                    continue
                pending = PENDING_FLAGS.get(b, set())
                for name in sorted(pending & set(flags)):
                    if "--" + name in self.helps[b]:
                        self.err(where, "--%s is in %s --help now: remove it from "
                                 "PENDING_FLAGS (tests/deploy/test_manifests.py)" % (name, b))
                    else:
                        self.note("%s: --%s is not in %s --help yet (PENDING_FLAGS: the C "
                                  "side of issue 25)" % (where, name, b))
                bad = [n for n in flags if "--" + n not in self.helps[b] and n not in pending]
                for name in bad:
                    self.err(where, "--%s is not an option of %s (not in its --help)" %
                             (name, b))
                if not bad and b in self.paths:
                    self.parse_with_binary(where, b, c)
            elif PAUSE_IMAGE.match(image):
                if c.get("command") or c.get("args"):
                    self.err(where, "the pause container takes no command or arguments")
            elif m:
                name = m.group(1)
                if name not in SIDECAR_FLAGS:
                    self.err(where, "unknown sidecar image %s" % image)
                    continue
                known = SIDECAR_FLAGS[name] | COMMON_FLAGS
                for flag in self.parse_args(where, c):
                    if flag not in known:
                        self.err(where, "--%s is not a flag of %s" % (flag, name))
            else:
                self.err(where, "image %r is neither ours nor a pinned registry.k8s.io/"
                         "sig-storage sidecar" % image)

    # -------------------------------------------------------- consistency
    def rbd_driver_names(self):
        """The plugins' --rbd-driver-name values (their second socket's name)."""
        names = set()
        for where, _, c, _ in self.all_containers():
            if self.binary_of(c) == "qsd-csi-plugin":
                for a in c.get("args") or []:
                    if str(a).startswith("--rbd-driver-name="):
                        names.add(str(a).split("=", 1)[1])
        return names

    def driver_name(self):
        """The local driver's name: the one CSIDriver that is not the RBD name."""
        drivers = [d for d in self.of_kind("CSIDriver")
                   if d[2]["metadata"]["name"] not in self.rbd_driver_names()]
        if len(drivers) != 1:
            self.err("deploy/", "expected exactly one CSIDriver of local volumes, found %d" %
                     len(drivers))
            return None
        return drivers[0][2]["metadata"]["name"]

    def rbd_driver_name(self):
        """The RBD name, when a CSIDriver of it is deployed, else None."""
        rbd = [d[2]["metadata"]["name"] for d in self.of_kind("CSIDriver")
               if d[2]["metadata"]["name"] in self.rbd_driver_names()]
        if len(self.rbd_driver_names()) > 1:
            self.err("deploy/", "the plugins name different --rbd-driver-name values: %s" %
                     sorted(self.rbd_driver_names()))
        return rbd[0] if rbd else None

    def check_consistency(self):
        driver = self.driver_name()
        if not driver:
            return
        rbd_driver = self.rbd_driver_name()
        for _, _, sc in self.of_kind("StorageClass"):
            # RBD classes go to the RBD name: the central provisioner serves
            # it only, and never sees (nor warns about) a local claim.
            want = rbd_driver if (sc.get("parameters") or {}).get("backend") == "rbd" else driver
            if sc.get("provisioner") != want:
                self.err("StorageClass %s" % sc["metadata"]["name"],
                         "provisioner %r != CSIDriver %r" % (sc.get("provisioner"), want))
        for _, _, vsc in self.of_kind("VolumeSnapshotClass"):
            if vsc.get("driver") not in (driver, rbd_driver):
                self.err("VolumeSnapshotClass %s" % vsc["metadata"]["name"],
                         "driver %r is not a CSIDriver of deploy/ (%r)" % (vsc.get("driver"), driver))
        # Group snapshots: local volumes only (one node's, stopped together).
        for _, _, vgc in self.of_kind("VolumeGroupSnapshotClass"):
            if vgc.get("driver") != driver:
                self.err("VolumeGroupSnapshotClass %s" % vgc["metadata"]["name"],
                         "driver %r is not the local volumes' CSIDriver %r" %
                         (vgc.get("driver"), driver))
        plugins = [(w, s, c, o) for w, s, c, o in self.all_containers()
                   if self.binary_of(c) == "qsd-csi-plugin"]
        if not plugins:
            self.err("deploy/", "no container runs qsd-csi-plugin")
        for where, spec, c, owner in plugins:
            if owner.get("kind") == "Deployment":
                self.check_controller_pod(where, spec, c, driver)
            else:
                self.check_node_pod(where, spec, c, driver)
        if not any(o.get("kind") == "Deployment" for _, _, _, o in plugins):
            self.err("deploy/", "no controller Deployment runs qsd-csi-plugin --role=controller "
                     "(RBD volumes have no node provisioner)")
        for where, spec, c, owner in self.all_containers():
            if self.binary_of(c) == "qsd-vm-launcher":
                self.check_vm_pod(where, spec, c, owner, driver)
        for _, _, pod in self.of_kind("Pod"):
            for v in (pod.get("spec") or {}).get("volumes") or []:
                if "hotplugInto" in ((v.get("csi") or {}).get("volumeAttributes") or {}):
                    self.check_attachment_pod(pod, v, driver)
                if "csi" in v and v["csi"].get("driver") != driver:
                    self.err("Pod %s" % pod["metadata"]["name"],
                             "inline CSI volume %s uses driver %r, not %r" %
                             (v.get("name"), v["csi"].get("driver"), driver))

    def mount_of(self, c, spec, path):
        """The volumeMount (and its volume) whose mountPath holds path (deepest)."""
        vols = {v.get("name"): v for v in spec.get("volumes") or []}
        best = None
        for m in c.get("volumeMounts") or []:
            mp = m.get("mountPath", "").rstrip("/")
            if path == mp or path.startswith(mp + "/"):
                if best is None or len(mp) > len(best[0].get("mountPath", "").rstrip("/")):
                    best = (m, vols.get(m.get("name")))
        return best

    def host_path(self, c, spec, path):
        """path inside container c -> path on the host, if on a hostPath volume."""
        mv = self.mount_of(c, spec, path)
        if not mv or not mv[1] or "hostPath" not in mv[1]:
            return None
        mp = mv[0]["mountPath"].rstrip("/")
        return mv[1]["hostPath"]["path"].rstrip("/") + path[len(mp):]

    def check_node_pod(self, where, spec, plugin, driver):
        flags = self.parse_args(where, plugin)
        name = flags.get("driver-name") or DRIVER_DEFAULT
        if name != driver:
            self.err(where, "--driver-name %r != CSIDriver %r" % (name, driver))
        if not (plugin.get("securityContext") or {}).get("privileged"):
            self.err(where, "the node plugin must be privileged (mounts, QSD)")
        # QSDs must outlive the plugin container (docs/process-model.md):
        # not in a PID namespace the plugin is PID 1 of, and in a cgroup of
        # their own on the host's hierarchies.
        if not spec.get("hostPID"):
            self.err(where, "hostPID must be true (QSDs outlive the plugin container)")
        if not flags.get("qsd-cgroup"):
            self.err(where, "--qsd-cgroup is missing (QSDs would die with the container)")
        if self.host_path(plugin, spec, "/sys/fs/cgroup") != "/sys/fs/cgroup":
            self.err(where, "the host's /sys/fs/cgroup is not mounted at /sys/fs/cgroup")
        endpoint = flags.get("endpoint") or "unix:///run/qsd-csi/csi.sock"
        sock = re.sub(r"^unix:(//)?", "", endpoint)
        host_sock = self.host_path(plugin, spec, sock)
        if not host_sock:
            self.err(where, "the CSI socket %s is not on a hostPath volume" % sock)
            return
        kroot = (flags.get("kubelet-root") or "/var/lib/kubelet").rstrip("/")
        if not host_sock.startswith("%s/plugins/%s/" % (kroot, driver)):
            self.err(where, "CSI socket on the host is %s, expected under "
                     "%s/plugins/%s/" % (host_sock, kroot, driver))
        # The second socket (--rbd-endpoint), under the same directory.
        sockets = {host_sock: driver}
        if flags.get("rbd-endpoint"):
            rsock = re.sub(r"^unix:(//)?", "", flags["rbd-endpoint"])
            rhost = self.host_path(plugin, spec, rsock)
            if not rhost or not rhost.startswith("%s/plugins/%s/" % (kroot, driver)) or \
                    rhost == host_sock:
                self.err(where, "the --rbd-endpoint socket on the host is %s, expected another "
                         "socket under %s/plugins/%s/" % (rhost, kroot, driver))
            else:
                sockets[rhost] = flags.get("rbd-driver-name")
        registered = set()
        # The kubelet directories the plugin works in, and only those:
        # publish targets under pods/, staging targets under plugins/, at
        # their host paths (kubelet passes host paths), Bidirectional (its
        # mounts must reach the host and the VM pods).
        for sub in ("pods", "plugins"):
            p = "%s/%s" % (kroot, sub)
            mv = self.mount_of(plugin, spec, p)
            if not mv or mv[0].get("mountPath", "").rstrip("/") != p or \
                    self.host_path(plugin, spec, p) != p:
                self.err(where, "%s (kubelet's %s/) must be a hostPath mount of the same path "
                         "(kubelet passes host paths)" % (p, sub))
            elif mv[0].get("mountPropagation") != "Bidirectional":
                self.err(where, "%s needs mountPropagation: Bidirectional" % p)
        for m in plugin.get("volumeMounts") or []:
            mp = m.get("mountPath", "").rstrip("/")
            if mp == kroot or kroot.startswith(mp + "/"):
                self.err(where, "volumeMount %s mounts %s, all of the kubelet root (or above): "
                         "mount only %s/pods and %s/plugins" % (m.get("name"), mp, kroot, kroot))
        # Directories that must be on the host (state survives restarts).
        for flag, default in (("run-dir", "/run/qsd-csi"), ("pool", "/var/lib/qsd-csi/pool"),
                              ("state-dir", "/var/lib/qsd-csi/state")):
            p = flags.get(flag) or default
            hp = self.host_path(plugin, spec, p)
            if hp is None:
                self.err(where, "--%s %s is not on a hostPath volume" % (flag, p))
            elif flag == "run-dir":
                mv = self.mount_of(plugin, spec, p)
                if mv[0].get("mountPropagation") != "Bidirectional":
                    self.err(where, "the run directory needs mountPropagation: Bidirectional "
                             "(hot-plug bridges are shared mounts made there)")
        if self.host_path(plugin, spec, "/dev") != "/dev":
            self.err(where, "/dev of the host is not mounted")
        # Every other container must reach the same socket.
        seen = set()
        for c in spec.get("containers") or []:
            if c is plugin:
                continue
            m = SIDECAR_IMAGE.match(str(c.get("image", "")))
            if not m:
                continue
            cw = "%s (sidecar %s)" % (where.rsplit(" container ", 1)[0], c.get("name"))
            sidecar = m.group(1)
            seen.add(sidecar)
            f = self.parse_args(cw, c)
            addr = f.get("csi-address")
            if not addr:
                self.err(cw, "no --csi-address")
                continue
            addr = re.sub(r"^unix:(//)?", "", addr)
            hp = self.host_path(c, spec, addr)
            if hp not in sockets:
                self.err(cw, "--csi-address %s is %s on the host, the plugin serves %s" %
                         (addr, hp, " and ".join(sorted(sockets))))
            elif hp != host_sock and sidecar != "csi-node-driver-registrar":
                self.err(cw, "--csi-address %s is the RBD name's socket: the node's %s serves "
                         "local volumes, on %s" % (addr, sidecar, host_sock))
            env = {e.get("name") for e in c.get("env") or []}
            if sidecar == "csi-node-driver-registrar":
                registered.add(hp)
                if f.get("kubelet-registration-path") != hp:
                    self.err(cw, "--kubelet-registration-path %r != the plugin socket on the "
                             "host %r" % (f.get("kubelet-registration-path"), hp))
                if self.host_path(c, spec, "/registration") != kroot + "/plugins_registry":
                    self.err(cw, "/registration is not kubelet's plugins_registry")
            if sidecar == "csi-provisioner":
                if f.get("node-deployment") != "true":
                    self.err(cw, "node-local volumes: --node-deployment=true needed")
                if "NODE_NAME" not in env:
                    self.err(cw, "--node-deployment needs the NODE_NAME env variable")
                if f.get("leader-election") == "true":
                    self.err(cw, "--leader-election cannot be combined with --node-deployment")
            if sidecar == "csi-provisioner":
                gates = f.get("feature-gates") or ""
                if "Topology=true" not in gates.split(","):
                    self.err(cw, "--feature-gates=Topology=true needed")
                if f.get("enable-capacity") != "true":
                    self.err(cw, "--enable-capacity=true needed")
                if f.get("capacity-ownerref-level") is None:
                    self.err(cw, "--capacity-ownerref-level needed")
                for e in ("NAMESPACE", "POD_NAME"):
                    if e not in env:
                        self.err(cw, "--enable-capacity needs the %s env variable" % e)
        for want in ("csi-node-driver-registrar", "livenessprobe", "csi-provisioner"):
            if want not in seen:
                self.err(where, "no %s sidecar next to the plugin" % want)
        if "csi-snapshotter" in seen:
            self.err(where, "a csi-snapshotter in the node DaemonSet: snapshots and group "
                     "snapshots of local volumes are the controller's central snapshotter's "
                     "(its group-snapshot controller has no per-node mode)")
        for sock, name in sockets.items():
            if sock not in registered:
                self.err(where, "no node-driver-registrar registers %s (driver %s) with kubelet"
                         % (sock, name))
        if "csi-resizer" in seen:
            self.err(where, "a csi-resizer in the node DaemonSet: the resizer has no per-node "
                     "mode; the one resizer of the driver runs in the controller Deployment")
        if flags.get("role") not in (None, "node"):
            self.err(where, "--role=%s in the node DaemonSet" % flags.get("role"))
        self.check_rbd_clusters(where, spec, plugin, flags)
        self.check_sidecars(where, spec)
        self.check_ports(where, spec, plugin, flags)
        self.check_serve_gate(where, spec, plugin, flags)
        for c in spec.get("initContainers") or []:
            if (c.get("securityContext") or {}).get("privileged"):
                self.err(where, "privileged init container %s (hostPath type "
                         "DirectoryOrCreate makes directories)" % c.get("name"))
        self.check_seccomp_install(where, spec)

    def check_seccomp_install(self, where, spec):
        """An init container installs the VM pods' profile under kubelet's
        seccomp directory, by the name the VM pods give."""
        vols = {v.get("name"): (v.get("hostPath") or {}).get("path") for v in spec.get("volumes") or []}
        root = next((e.get("value") for c in spec.get("containers") or [] for e in c.get("env") or []
                     if e.get("name") == "KUBELET_ROOT"), "/var/lib/kubelet")
        want = "/seccomp/" + SECCOMP_VM["localhostProfile"]
        for c in spec.get("initContainers") or []:
            cmd = " ".join(c.get("command") or [])
            mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts") or []}
            if "/usr/local/share/qsd-csi/seccomp/vm-launcher.json" in cmd and want in cmd and \
                    vols.get(mounts.get("/seccomp")) == root + "/seccomp":
                return
        self.err(where, "no init container copies the VM pods' seccomp profile to %s%s (the "
                 "hostPath %s/seccomp at /seccomp)" % (root, want, root))

    def check_seccomp_profile(self):
        try:
            with open(os.path.join(self.root, SECCOMP_FILE)) as f:
                prof = json.load(f)
        except (OSError, ValueError) as e:
            self.err(SECCOMP_FILE, "unreadable: %s" % e)
            return
        if prof.get("defaultAction") != "SCMP_ACT_ERRNO":
            self.err(SECCOMP_FILE, "defaultAction %s: an allow list refuses by default"
                     % prof.get("defaultAction"))
        allowed = {n for r in prof.get("syscalls") or [] if r.get("action") == "SCMP_ACT_ALLOW"
                   for n in r.get("names") or []}
        for n in sorted(SECCOMP_MUST_ALLOW - allowed):
            self.err(SECCOMP_FILE, "%s is not allowed (passt or the launcher needs it)" % n)
        for n in sorted(SECCOMP_MUST_REFUSE & allowed):
            self.err(SECCOMP_FILE, "%s is allowed: RuntimeDefault refuses it, so must this" % n)

    def check_rbd_clusters(self, where, spec, plugin, flags):
        """--rbd-clusters: a file of a ConfigMap of deploy/, its directory
        mounted whole (no subPath: edits reach it)."""
        path = flags.get("rbd-clusters")
        if not path:
            self.err(where, "no --rbd-clusters (the cluster ids of RBD StorageClasses)")
            return
        mv = self.mount_of(plugin, spec, path)
        cm = ((mv[1] or {}).get("configMap") or {}) if mv else {}
        if not cm.get("name"):
            self.err(where, "--rbd-clusters %s is not on a ConfigMap volume" % path)
            return
        if mv[0].get("subPath"):
            self.err(where, "--rbd-clusters: subPath mount, a ConfigMap edit would not reach it")
        doc = self.find("ConfigMap", cm["name"], self.namespace_of(plugin))
        key = path[len(mv[0]["mountPath"].rstrip("/")) + 1:]
        data = ((doc or {}).get("data") or {}).get(key)
        if data is None:
            self.err(where, "--rbd-clusters %s: no ConfigMap %s with a key %s in deploy/" %
                     (path, cm["name"], key))
            return
        try:
            ids = {e["clusterID"] for e in json.loads(data)}
        except (ValueError, KeyError, TypeError) as e:
            self.err("ConfigMap %s" % cm["name"], "%s is no cluster list: %s" % (key, e))
            return
        self.rbd_cluster_ids = ids

    def namespace_of(self, container):
        for _, _, c, owner in self.all_containers():
            if c is container:
                return owner["metadata"].get("namespace")
        return None

    def check_controller_pod(self, where, spec, plugin, driver):
        """The controller Deployment: the plugin in its controller role with
        the central sidecars, nothing privileged, no host path."""
        flags = self.parse_args(where, plugin)
        if flags.get("role") != "controller":
            self.err(where, "the controller Deployment's plugin needs --role=controller")
        if (flags.get("driver-name") or DRIVER_DEFAULT) != driver:
            self.err(where, "--driver-name %r != CSIDriver %r" % (flags.get("driver-name"), driver))
        for k in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(k):
                self.err(where, "%s: the controller needs nothing of the host" % k)
        for v in spec.get("volumes") or []:
            if "hostPath" in v:
                self.err(where, "hostPath volume %s: the controller needs no node state or /dev"
                         % v.get("name"))
        psc = spec.get("securityContext") or {}
        if not psc.get("runAsNonRoot") or not psc.get("runAsUser"):
            self.err(where, "the controller pod must run as a non-root user (runAsNonRoot, "
                     "runAsUser)")
        for c in spec.get("containers") or []:
            sc = c.get("securityContext") or {}
            cw = "%s (container %s)" % (where.rsplit(" container ", 1)[0], c.get("name"))
            if self.binary_of(c) == GATE:
                continue  # root at start, some capabilities: check_gate
            if sc.get("privileged") or (sc.get("capabilities") or {}).get("add"):
                self.err(cw, "privileged or added capabilities in the controller")
            if sc.get("allowPrivilegeEscalation") is not False:
                self.err(cw, "set allowPrivilegeEscalation: false")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                self.err(cw, "drop ALL capabilities")
            if not sc.get("readOnlyRootFilesystem"):
                self.err(cw, "set readOnlyRootFilesystem: true (it writes nothing)")
            if (sc.get("seccompProfile") or {}).get("type") not in (None, "RuntimeDefault"):
                self.err(cw, "seccomp %s: every container runs under RuntimeDefault (the "
                         "event loop falls back to epoll)" % sc["seccompProfile"].get("type"))
        endpoint = flags.get("endpoint") or "unix:///run/qsd-csi/csi.sock"
        sock = re.sub(r"^unix:(//)?", "", endpoint)
        mv = self.mount_of(plugin, spec, sock)
        if not mv or not mv[1] or "emptyDir" not in mv[1]:
            self.err(where, "the CSI socket %s is not on an emptyDir shared with the sidecars"
                     % sock)
            return
        # The plugin's sockets, relative to the shared emptyDir: --endpoint
        # (the local name) and --rbd-endpoint (the RBD name).
        rel = {sock[len(mv[0]["mountPath"].rstrip("/")):]: "local"}
        if flags.get("rbd-endpoint"):
            rsock = re.sub(r"^unix:(//)?", "", flags["rbd-endpoint"])
            rmv = self.mount_of(plugin, spec, rsock)
            if not rmv or rmv[0].get("name") != mv[0].get("name"):
                self.err(where, "the --rbd-endpoint socket %s is not on the sidecars' emptyDir"
                         % rsock)
            else:
                rel[rsock[len(rmv[0]["mountPath"].rstrip("/")):]] = "rbd"
        seen, snapshotters = set(), set()
        for c in spec.get("containers") or []:
            m = SIDECAR_IMAGE.match(str(c.get("image", "")))
            if c is plugin or not m:
                continue
            name = m.group(1)
            seen.add(name)
            cw = "%s (sidecar %s)" % (where.rsplit(" container ", 1)[0], c.get("name"))
            f = self.parse_args(cw, c)
            addr = re.sub(r"^unix:(//)?", "", f.get("csi-address") or "")
            cm = self.mount_of(c, spec, addr) if addr else None
            which = rel.get(addr[len(cm[0]["mountPath"].rstrip("/")):]) if cm else None
            if not cm or cm[0].get("name") != mv[0].get("name") or which is None:
                self.err(cw, "--csi-address %r is not one of the plugin's sockets" % addr)
            elif name == "csi-provisioner" and which != "rbd":
                # The central provisioner serves RBD volumes only: under the
                # local name it would refuse, with a warning event, every
                # local claim.
                self.err(cw, "--csi-address %r: the central %s must be on the RBD name's "
                         "socket (--rbd-endpoint)" % (addr, name))
            elif name == "csi-snapshotter":
                snapshotters.add(which)
            for flag in sorted(NODE_ONLY_FLAGS):
                if f.get(flag) not in (None, "false"):
                    self.err(cw, "--%s in the controller: central mode only (node-local "
                             "volumes are the node sidecars')" % flag)
            env = {e.get("name") for e in c.get("env") or []}
            if "$(NAMESPACE)" in str(c.get("args")) and "NAMESPACE" not in env:
                self.err(cw, "uses $(NAMESPACE) without the NAMESPACE env variable")
        for want in CONTROLLER_SIDECAR_FLAGS:
            if want not in seen:
                self.err(where, "no %s sidecar in the controller" % want)
        if "local" not in snapshotters:
            # Local volumes' snapshots and group snapshots: the plugin
            # forwards them to the volume's node (--node-dial).
            self.err(where, "no csi-snapshotter on the local name's socket (%s)" % sock)
        if "local" in snapshotters and not flags.get("node-dial"):
            self.err(where, "a csi-snapshotter for local volumes without --node-dial: the "
                     "controller plugin would refuse every local snapshot")
        self.check_rbd_clusters(where, spec, plugin, flags)
        self.check_sidecars(where, spec, CONTROLLER_SIDECAR_FLAGS, privileged=False)
        self.check_ports(where, spec, plugin, flags)
        self.check_dial_gate(where, spec, plugin, flags)

    # ------------------------------------------------------ node endpoint
    def gates(self, spec, dial):
        return [c for c in spec.get("containers") or [] if self.binary_of(c) == GATE and
                ("dial" in self.parse_args("gate", c)) == dial]

    @staticmethod
    def effective(spec, c, key):
        """A securityContext field of container c, else its pod's."""
        sc = c.get("securityContext") or {}
        return sc[key] if key in sc else (spec.get("securityContext") or {}).get(key)

    def check_gate(self, cw, spec, gate, gflags):
        """qsd-node-gate's start: root with exactly GATE_CAPS, dropped by the
        gate itself; everything else closed."""
        sc = gate.get("securityContext") or {}
        caps = sc.get("capabilities") or {}
        if sc.get("privileged"):
            self.err(cw, "privileged: the gate needs %s only" % ", ".join(sorted(GATE_CAPS)))
        if "ALL" not in (caps.get("drop") or []):
            self.err(cw, "drop ALL capabilities (it needs %s only)" % ", ".join(sorted(GATE_CAPS)))
        added = {str(x).upper().replace("CAP_", "") for x in caps.get("add") or []}
        if added != GATE_CAPS:
            self.err(cw, "capabilities.add %s: the confinement needs exactly %s (more: %s; "
                     "missing: %s)" % (sorted(added), sorted(GATE_CAPS),
                                       sorted(added - GATE_CAPS) or "none",
                                       sorted(GATE_CAPS - added) or "none"))
        if sc.get("allowPrivilegeEscalation") is not False:
            self.err(cw, "set allowPrivilegeEscalation: false (no_new_privs from the start)")
        if not sc.get("readOnlyRootFilesystem"):
            self.err(cw, "set readOnlyRootFilesystem: true (it writes nothing)")
        if self.effective(spec, gate, "runAsUser") != 0:
            self.err(cw, "runAsUser must be 0: the gate starts as root to confine itself "
                     "(its capabilities are not effective for another user)")
        prof = (self.effective(spec, gate, "seccompProfile") or {}).get("type")
        if prof not in ("RuntimeDefault", "Localhost"):
            self.err(cw, "seccompProfile %s: RuntimeDefault until the gate's own profile" % prof)
        for k in ("uid", "gid"):
            if not str(gflags.get(k) or "").isdigit() or int(gflags[k]) == 0:
                self.err(cw, "--%s %r: the gate must confine itself to a non-root identity" %
                         (k, gflags.get(k)))

    def check_socket_share(self, where, spec, plugin, ppath, gate, gpath, what):
        """The plugin's ppath and the gate's gpath are one socket in an
        emptyDir that no other container mounts."""
        pm, gm = self.mount_of(plugin, spec, ppath), self.mount_of(gate, spec, gpath)
        if not pm or not pm[1] or "emptyDir" not in pm[1]:
            self.err(where, "%s %s is not on an emptyDir" % (what, ppath))
            return
        rel = ppath[len(pm[0]["mountPath"].rstrip("/")):]
        if not gm or gm[0].get("name") != pm[0].get("name") or \
                gpath[len(gm[0]["mountPath"].rstrip("/")):] != rel:
            self.err(where, "%s: the plugin's %s and gate %s's %s are not the same socket" %
                     (what, ppath, gate.get("name"), gpath))
            return
        vol = pm[0]["name"]
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            if c is not plugin and c is not gate and \
                    any(m.get("name") == vol for m in c.get("volumeMounts") or []):
                self.err(where, "%s: container %s mounts %s, the directory of the socket: only "
                         "the plugin and the gate may" % (what, c.get("name"), vol))

    def check_tls_secret(self, cw, spec, gate, gflags, secret):
        """--ca, --cert and --key: files of the Secret, mounted read-only in
        the gate alone, not readable by group or others."""
        found = [self.mount_of(gate, spec, gflags.get(k) or "") for k in ("ca", "cert", "key")]
        names = {mv[0].get("name") for mv in found if mv}
        v = found[0][1] if found[0] and found[0][1] else {}
        if None in found or len(names) != 1 or \
                (v.get("secret") or {}).get("secretName") != secret:
            self.err(cw, "--ca, --cert, --key are not files of one mount of the Secret %s" % secret)
            return
        vol = names.pop()
        if found[0][0].get("readOnly") is not True:
            self.err(cw, "the Secret %s must be mounted read-only (readOnly: true)" % secret)
        mode = v["secret"].get("defaultMode", 0o644)
        if mode & 0o077:
            self.err(cw, "the Secret %s's defaultMode %o lets group or others read the key" %
                     (secret, mode))
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            if c is not gate and any(m.get("name") == vol for m in c.get("volumeMounts") or []):
                self.err(cw, "container %s mounts the Secret %s too: the gate alone holds the "
                         "key" % (c.get("name"), secret))
        for x in spec.get("volumes") or []:
            if x.get("name") != vol and (x.get("secret") or {}).get("secretName") == secret:
                self.err(cw, "the Secret %s is a second volume too (%s)" % (secret, x.get("name")))

    def check_serve_gate(self, where, spec, plugin, flags):
        """The node DaemonSet's node-gate: mutual TLS on the node's address,
        forwarding to the plugin's --node-ops-endpoint."""
        gates = self.gates(spec, dial=False)
        if len(gates) != 1 or self.gates(spec, dial=True):
            self.err(where, "expected one qsd-node-gate (serve mode) in the node pod, found %d "
                     "(and %d --dial)" % (len(gates), len(self.gates(spec, dial=True))))
            return
        gate = gates[0]
        cw = "%s (container %s)" % (where.rsplit(" container ", 1)[0], gate.get("name"))
        g = self.parse_args(cw, gate)
        self.check_gate(cw, spec, gate, g)
        ops = re.sub(r"^unix:(//)?", "", flags.get("node-ops-endpoint") or "")
        if not ops:
            self.err(where, "no --node-ops-endpoint: the node gate has nothing to forward to")
        else:
            self.check_socket_share(where, spec, plugin, ops, gate, g.get("forward") or "",
                                    "the node-operations socket")
        if str(flags.get("node-ops-group")) != str(g.get("gid")):
            self.err(where, "--node-ops-group %s is not the gate's --gid %s: the confined gate "
                     "could not connect to the socket (0660)" % (flags.get("node-ops-group"),
                                                                 g.get("gid")))
        # The node's address from the downward API, on the host network.
        raw = next((str(a) for a in gate.get("args") or [] if str(a).startswith("--listen=")), "")
        # (brackets allowed: [$(HOST_IP)]:PORT, should the gate take them
        # around IPv4 too, is the one spelling that fits IPv6 nodes)
        m = re.fullmatch(r"--listen=(\[)?\$\(([A-Za-z_][A-Za-z0-9_]*)\)(?(1)\]):(\d+)", raw)
        env = {e.get("name"): ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
               for e in gate.get("env") or []}
        if not m or env.get(m.group(2)) != "status.hostIP":
            self.err(cw, "--listen %r: must be $(VAR):PORT with VAR from the downward API's "
                     "status.hostIP (the node's address only)" % raw[len("--listen="):])
        else:
            port = int(m.group(3))
            if not spec.get("hostNetwork"):
                self.err(cw, "the node endpoint needs the host network (the node's address)")
            if not any(p.get("containerPort") == port and p.get("protocol", "TCP") == "TCP"
                       for p in gate.get("ports") or []):
                self.err(cw, "--listen port %d is not a container port of the gate" % port)
        if g.get("peer-name") != CONTROLLER_PEER:
            self.err(cw, "--peer-name %r: the controller's certificate names %s" %
                     (g.get("peer-name"), CONTROLLER_PEER))
        self.check_tls_secret(cw, spec, gate, g, NODE_TLS_SECRET)

    def check_dial_gate(self, where, spec, plugin, flags):
        """The controller Deployment's node-dial-gate: the plugin's --node-dial
        socket, the controller's key pair, the API server."""
        gates = self.gates(spec, dial=True)
        if len(gates) != 1 or self.gates(spec, dial=False):
            self.err(where, "expected one qsd-node-gate --dial in the controller pod, found %d "
                     "(and %d in serve mode)" % (len(gates), len(self.gates(spec, dial=False))))
            return
        gate = gates[0]
        cw = "%s (container %s)" % (where.rsplit(" container ", 1)[0], gate.get("name"))
        g = self.parse_args(cw, gate)
        self.check_gate(cw, spec, gate, g)
        dial = re.sub(r"^unix:(//)?", "", flags.get("node-dial") or "")
        if not dial:
            self.err(where, "no --node-dial: the controller plugin cannot reach a node")
        else:
            self.check_socket_share(where, spec, plugin, dial, gate, g.get("listen-unix") or "",
                                    "the dial socket")
        # The socket is 0660, owned by the gate's starting uid and gid.
        puid, pgid = self.effective(spec, plugin, "runAsUser"), \
            self.effective(spec, plugin, "runAsGroup")
        ggid = self.effective(spec, gate, "runAsGroup")
        if puid not in (None, 0) and pgid != (ggid if ggid is not None else 0):
            self.err(cw, "runAsGroup %s: the dial socket (0660) is root:%s, the plugin runs as "
                     "%s:%s and could not connect" % (ggid, ggid or 0, puid, pgid))
        if g.get("peer-name") != NODE_PEER:
            self.err(cw, "--peer-name %r: the nodes' certificate names %s" %
                     (g.get("peer-name"), NODE_PEER))
        want = {"api-host": "$(KUBERNETES_SERVICE_HOST)", "api-port": "$(KUBERNETES_SERVICE_PORT)",
                "api-ca": SA_DIR + "/ca.crt"}
        for k, v in want.items():
            if g.get(k) != v:
                self.err(cw, "--%s %r, expected %s" % (k, g.get(k), v))
        if flags.get("api-token-file") not in (None, SA_DIR + "/token"):
            self.err(where, "--api-token-file %s is not the ServiceAccount's token" %
                     flags["api-token-file"])
        if spec.get("automountServiceAccountToken") is False:
            self.err(where, "automountServiceAccountToken: false: the API server's CA and the "
                     "token are the ServiceAccount's")
        self.check_tls_secret(cw, spec, gate, g, CONTROLLER_TLS_SECRET)

    def check_node_endpoint(self):
        """Across the workloads: the port the dial gates dial is the one the
        node gates listen on."""
        listen, dial = set(), set()
        for where, spec, c, owner in self.all_containers():
            if self.binary_of(c) != GATE:
                continue
            f = self.parse_args(where, c)
            if "dial" in f:
                dial.add(str(f.get("port")))
            elif f.get("listen"):
                listen.add(str(f["listen"]).rsplit(":", 1)[-1])
        if (listen or dial) and (len(listen) != 1 or listen != dial):
            self.err("deploy/", "the dial gates dial port %s, the node gates listen on %s" %
                     (" ".join(sorted(dial)) or "none", " ".join(sorted(listen)) or "none"))

    def check_sidecars(self, where, spec, required=None, privileged=True):
        """Release, required flags and SELinux-compatible access of each sidecar."""
        required = SIDECAR_REQUIRED_FLAGS if required is None else required
        for c in spec.get("containers") or []:
            m = SIDECAR_IMAGE.match(str(c.get("image", "")))
            if not m:
                continue
            cw = "%s (sidecar %s)" % (where.rsplit(" container ", 1)[0], c.get("name"))
            name, tag = m.group(1), m.group(2)
            if name in SIDECAR_RELEASES and tag != SIDECAR_RELEASES[name]:
                self.err(cw, "%s:%s is not the release this deployment is checked against "
                         "(%s): update the tag in kustomization.yaml (and SIDECAR_RELEASES after "
                         "reading the release notes)" % (name, tag, SIDECAR_RELEASES[name]))
            f = self.parse_args(cw, c)
            for flag, want in required.get(name, {}).items():
                have = f.get(flag)
                if have is None:
                    self.err(cw, "--%s%s is missing" % (flag, "=" + want if want else ""))
                elif want is not None and want not in str(have).split(","):
                    self.err(cw, "--%s=%s, this deployment needs %s" % (flag, have, want))
            sc = c.get("securityContext") or {}
            if privileged and not sc.get("privileged"):
                self.err(cw, "not privileged: on SELinux nodes it cannot connect to the "
                         "privileged plugin's socket")
            if not sc.get("readOnlyRootFilesystem"):
                self.err(cw, "set readOnlyRootFilesystem: true (it writes nothing)")

    def check_ports(self, where, spec, plugin, flags):
        """One port per endpoint in the pod's network namespace; the plugin's
        --http-endpoint is its container port named "metrics"."""
        used = {}
        for c in spec.get("containers") or []:
            f = self.parse_args(where, c)
            ports = set()
            for flag in ("http-endpoint", "metrics-address", "health-port"):
                v = f.get(flag)
                if v:
                    ports.add(int(str(v).rsplit(":", 1)[-1]))
            for p in c.get("ports") or []:
                if c is not plugin:
                    ports.add(p.get("containerPort"))
            for p in ports:
                if p in used:
                    self.err(where, "port %s used by %s and %s" % (p, used[p], c.get("name")))
                used[p] = c.get("name")
        ep = flags.get("http-endpoint")
        metrics = [p for p in plugin.get("ports") or [] if p.get("name") == "metrics"]
        if not ep:
            self.err(where, "the plugin has no --http-endpoint (its /metrics and /healthz)")
        elif not metrics or str(metrics[0].get("containerPort")) != str(ep).rsplit(":", 1)[-1]:
            self.err(where, "--http-endpoint=%s is not the plugin's container port named "
                     "\"metrics\" (%s)" % (ep, metrics[0].get("containerPort") if metrics
                                           else "none"))

    def check_priority(self):
        for f, i, d in self.of_kind("DaemonSet"):
            spec = ((d.get("spec") or {}).get("template") or {}).get("spec") or {}
            pc = spec.get("priorityClassName")
            where = "DaemonSet %s" % d["metadata"]["name"]
            ns = d["metadata"].get("namespace")
            if pc in SYSTEM_PRIORITY and ns != "kube-system":
                self.err(where, "priorityClassName %s outside kube-system: some clusters refuse "
                         "it; use the PriorityClass of 25-priorityclass.yaml" % pc)
            elif pc and pc not in SYSTEM_PRIORITY and not self.find("PriorityClass", pc):
                self.err(where, "priorityClassName %s is not a PriorityClass in deploy/" % pc)

    def check_rbac(self):
        """What each workload's ServiceAccount may do == WORKLOAD_RBAC[kind]."""
        for f, i, ds in self.of_kind("DaemonSet") + self.of_kind("Deployment"):
            want = WORKLOAD_RBAC[ds["kind"]]
            ns = ds["metadata"].get("namespace")
            sa = ((ds["spec"].get("template") or {}).get("spec") or {}).get("serviceAccountName")
            granted = {}
            for kind in ("ClusterRoleBinding", "RoleBinding"):
                for _, _, b in self.of_kind(kind):
                    if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa and
                               (s.get("namespace") or b["metadata"].get("namespace")) == ns
                               for s in b.get("subjects") or []):
                        continue
                    ref = b.get("roleRef") or {}
                    scope = None if kind == "ClusterRoleBinding" else "ns"
                    role = self.find(ref.get("kind"), ref.get("name"),
                                     b["metadata"].get("namespace") if ref.get("kind") == "Role"
                                     else None)
                    for r in (role or {}).get("rules") or []:
                        for g in r.get("apiGroups") or []:
                            for res in r.get("resources") or []:
                                for v in r.get("verbs") or []:
                                    granted[(scope, g, res, v)] = "%s %s" % (ref.get("kind"),
                                                                             ref.get("name"))
            where = "ServiceAccount %s/%s" % (ns, sa)
            def show(k):
                return "%s %s %s%s" % (k[3], k[2], "(group %r) " % k[1] if k[1] else "",
                                       "in its namespace" if k[0] else "cluster-wide")
            for k, why in sorted(want.items(), key=lambda x: str(x[0])):
                if k not in granted:
                    self.err(where, "may not %s: %s needs it" % (show(k), why))
            for k, src in sorted(granted.items(), key=lambda x: str(x[0])):
                if k not in want:
                    self.err(where, "may %s (%s): no sidecar needs it (least privilege)" %
                             (show(k), src))

    def check_vm_pod(self, where, spec, c, owner, driver):
        if owner.get("kind") != "Pod":
            return
        ns = owner["metadata"]["namespace"]
        for k in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(k):
                self.err(where, "%s in a VM pod" % k)
        prof = (spec.get("securityContext") or {}).get("seccompProfile")
        if prof != SECCOMP_VM:
            self.err(where, "a VM pod's seccompProfile must be %s (the driver's profile: passt, its "
                     "network, needs user namespaces), not %s" % (SECCOMP_VM, prof))
        if spec.get("shareProcessNamespace"):
            self.err(where, "shareProcessNamespace in a VM pod: not needed (the launcher as PID 1 "
                     "reaps through its init) and it shows the pod's processes to each other")
        for v in spec.get("volumes") or []:
            if "hostPath" in v:
                self.err(where, "hostPath volume %s in a VM pod" % v.get("name"))
        for cc in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            sc = cc.get("securityContext") or {}
            if sc.get("privileged"):
                self.err(where, "privileged container %s" % cc.get("name"))
            if sc.get("allowPrivilegeEscalation") is not False:
                self.err(where, "container %s: set allowPrivilegeEscalation: false" %
                         cc.get("name"))
            if (sc.get("capabilities") or {}).get("add"):
                self.err(where, "container %s adds capabilities" % cc.get("name"))
        if (spec.get("securityContext") or {}).get("fsGroup") is None:
            self.err(where, "no fsGroup: the sockets' group comes from it")
        flags = self.parse_args(where, c)
        dirs = list(flags.get("volumes-dir") or [])
        if flags.get("volumes"):
            dirs.append(flags["volumes"])
        dirs = [d.rstrip("/") for d in dirs]
        if not dirs:
            self.err(where, "no --volumes-dir")
        for i, a in enumerate(dirs):
            for b in dirs[:i]:
                if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                    self.err(where, "volumes directories %s and %s: the same, or one inside "
                             "the other (the launcher refuses it)" % (b, a))
        # The bridge: exactly one volumes directory is the bridge mount.
        bridges = []
        for d in dirs:
            mv = self.mount_of(c, spec, d)
            if mv and mv[0]["mountPath"].rstrip("/") == d and mv[1] and \
                    ((mv[1].get("csi") or {}).get("volumeAttributes") or {}).get("bridge") == "true":
                bridges.append((d, mv))
        if len(bridges) != 1:
            self.err(where, "exactly one --volumes-dir must be the bridge (an inline CSI volume "
                     "of %s with bridge: \"true\", mounted at that path); found %d" %
                     (driver, len(bridges)))
        bridge = None
        if bridges:
            bridge, (m, v) = bridges[0]
            if v["csi"].get("driver") != driver:
                self.err(where, "the bridge must be an inline CSI volume of %s" % driver)
            if m.get("mountPropagation") != "HostToContainer":
                self.err(where, "the bridge mount needs mountPropagation: HostToContainer "
                         "(volumes hot-plugged later are mounts made on the host)")
            if m.get("readOnly") is not True:
                self.err(where, "the bridge mount must be readOnly: true (the VM pod cannot "
                         "write into it)")
            # Nothing may need a mount point inside the (read-only) bridge.
            for om in c.get("volumeMounts") or []:
                if om is not m and om.get("mountPath", "").rstrip("/").startswith(bridge + "/"):
                    self.err(where, "volume %s is mounted at %s, inside the bridge %s: mount it "
                             "beside the bridge (another --volumes-dir)" %
                             (om.get("name"), om.get("mountPath"), bridge))
        # PVC mounts: directly in a volumes directory other than the bridge.
        vols = {v.get("name"): v for v in spec.get("volumes") or []}
        pvc_dirs = {}
        for m in c.get("volumeMounts") or []:
            v = vols.get(m.get("name")) or {}
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"].get("claimName")
                if not self.find("PersistentVolumeClaim", claim, ns):
                    self.err(where, "PVC %s is not defined in deploy/" % claim)
                parent, base = os.path.split(m["mountPath"].rstrip("/"))
                if parent not in dirs or parent == bridge:
                    self.err(where, "PVC %s is mounted at %s, not directly in a volumes "
                             "directory other than the bridge (%s)" %
                             (claim, m["mountPath"], ", ".join(d for d in dirs if d != bridge)))
                if m.get("readOnly") is not True:
                    self.err(where, "PVC %s: its mount must be readOnly: true (the launcher "
                             "only reads it; the disk stays writable)" % claim)
                if v["persistentVolumeClaim"].get("readOnly"):
                    self.err(where, "PVC %s: persistentVolumeClaim.readOnly would publish it "
                             "read-only (a read-only disk); use volumeMounts[].readOnly" % claim)
                if base in pvc_dirs:
                    self.err(where, "disk name %r mounted twice (the launcher refuses it)" % base)
                pvc_dirs[base] = parent
        root = (flags.get("root") or "/var/lib/qsd-vm-launcher")
        rv = self.mount_of(c, spec, root)
        if not rv or not rv[1] or "emptyDir" not in rv[1]:
            self.err(where, "--root %s should be an emptyDir (writable, per pod)" % root)
        # The VM description.
        spec_path = flags.get("spec")
        sm = self.mount_of(c, spec, spec_path or "")
        if not spec_path or not sm or not sm[1] or "configMap" not in sm[1]:
            self.err(where, "--spec %r is not in a ConfigMap volume" % spec_path)
            return
        cm_name = sm[1]["configMap"].get("name")
        cm = self.find("ConfigMap", cm_name, ns)
        key = os.path.relpath(spec_path, sm[0]["mountPath"])
        if not cm or key not in (cm.get("data") or {}):
            self.err(where, "--spec: ConfigMap %s has no key %s" % (cm_name, key))
            return
        try:
            desc = json.loads(cm["data"][key])
        except ValueError as e:
            self.err("ConfigMap %s" % cm_name, "%s is not JSON: %s" % (key, e))
            return
        # "hotplug": true disks come later, through the bridge (attachment pods).
        wanted = [d.get("volume") for d in desc.get("disks") or [] if d.get("hotplug") is not True]
        if (desc.get("boot") or {}).get("volume"):
            wanted.append(desc["boot"]["volume"])
        for w in wanted:
            if w not in pvc_dirs:
                self.err("ConfigMap %s" % cm_name, "disk %r is not a PVC mounted at "
                         "<volumes directory>/%s" % (w, w))
        if self.launcher:
            self.launcher_dry_run(where, cm["data"][key], dirs,
                                  {w: pvc_dirs.get(w) for w in sorted(set(wanted))})
        else:
            self.note("qsd-vm-launcher not built: launcher flags and the VM description "
                      "were checked statically only")

    def check_attachment_pod(self, pod, req, driver):
        """A hot-plug attachment pod (docs/hotplug-bridge.md)."""
        where = "Pod %s" % pod["metadata"]["name"]
        ns = pod["metadata"].get("namespace")
        spec = pod.get("spec") or {}
        attrs = req["csi"].get("volumeAttributes") or {}
        unknown = set(attrs) - {"hotplugInto", "disk"}
        if unknown:
            self.err(where, "hot-plug request with unknown attributes %s" % sorted(unknown))
        if attrs.get("disk") is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
                                                          str(attrs["disk"])):
            self.err(where, "disk %r is not a valid disk name" % attrs["disk"])
        vm = self.find("Pod", attrs.get("hotplugInto"), ns)
        if not vm:
            self.err(where, "hotplugInto %r: no such pod in namespace %s (hot-plug stays in "
                     "one namespace)" % (attrs.get("hotplugInto"), ns))
            return
        vspec = vm.get("spec") or {}
        if not any(((v.get("csi") or {}).get("volumeAttributes") or {}).get("bridge") == "true"
                   for v in vspec.get("volumes") or []):
            self.err(where, "pod %s has no bridge volume" % attrs["hotplugInto"])
        fg = (spec.get("securityContext") or {}).get("fsGroup")
        vfg = (vspec.get("securityContext") or {}).get("fsGroup")
        if fg != vfg:
            self.err(where, "fsGroup %r differs from the VM pod's %r (one socket, one group)" %
                     (fg, vfg))
        aff = ((spec.get("affinity") or {}).get("podAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or []
        labels = (vm.get("metadata") or {}).get("labels") or {}
        on_node = spec.get("nodeName") or any(
            t.get("topologyKey") == "kubernetes.io/hostname" and
            all(labels.get(k) == val for k, val in
                ((t.get("labelSelector") or {}).get("matchLabels") or {}).items())
            for t in aff)
        if not on_node:
            self.err(where, "not pinned to the VM pod's node (nodeName, or a required "
                     "podAffinity to it with topologyKey kubernetes.io/hostname)")
        if spec.get("automountServiceAccountToken") is not False:
            self.err(where, "set automountServiceAccountToken: false (it needs no API access)")
        for k in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(k):
                self.err(where, "%s in an attachment pod" % k)
        mounted = {m.get("name") for c in spec.get("containers") or []
                   for m in c.get("volumeMounts") or []}
        for c in spec.get("containers") or []:
            sc = c.get("securityContext") or {}
            if sc.get("privileged") or (sc.get("capabilities") or {}).get("add") or \
                    sc.get("allowPrivilegeEscalation") is not False:
                self.err(where, "container %s: privileged, added capabilities or privilege "
                         "escalation" % c.get("name"))
        pvcs = 0
        for v in spec.get("volumes") or []:
            if v.get("name") not in mounted:
                self.err(where, "volume %s is not mounted by any container: kubelet would not "
                         "publish it" % v.get("name"))
            if "persistentVolumeClaim" in v:
                pvcs += 1
                claim = v["persistentVolumeClaim"].get("claimName")
                if not self.find("PersistentVolumeClaim", claim, ns):
                    self.err(where, "PVC %s is not defined in deploy/" % claim)
        if not pvcs:
            self.err(where, "a hot-plug request without a PVC plugs nothing")
        if attrs.get("disk") is not None and pvcs > 1:
            self.err(where, "disk names one disk but the pod mounts %d PVCs" % pvcs)

    def launcher_dry_run(self, where, text, dirs, volumes):
        """Let the real launcher build a domain from the description (--dry-run),
        with the manifest's volumes directories (each a temporary directory) and
        each wanted volume in the directory the manifest mounts it in."""
        tmp = tempfile.mkdtemp(prefix="qsd-deploy-test-")
        socks = []
        try:
            with open(os.path.join(tmp, "vm.json"), "w") as fh:
                fh.write(text)
            local = {}
            args = []
            for i, d in enumerate(dirs):
                local[d] = os.path.join(tmp, "dir%d" % i)
                os.mkdir(local[d])
                args += ["--volumes-dir", local[d]]
            volumes = {v: p for v, p in volumes.items() if p in local}
            for v, parent in volumes.items():
                d = os.path.join(local[parent], v)
                os.mkdir(d)
                with open(os.path.join(d, "volume.json"), "w") as fh:
                    json.dump({"version": 1, "volume": "pvc-test-" + v, "size": 1 << 30,
                               "read_only": False, "num_queues": 1,
                               "logical_block_size": 512, "socket": "vhost.sock"}, fh)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.bind(os.path.join(d, "vhost.sock"))
                s.listen(8)
                socks.append(s)
            p = subprocess.run([self.launcher, "--spec", os.path.join(tmp, "vm.json")] + args +
                               ["--root", os.path.join(tmp, "root"),
                                "--wait-volumes", "5", "--dry-run"],
                               capture_output=True, text=True, timeout=60)
            if p.returncode != 0 or "<domain" not in p.stdout:
                self.err(where, "qsd-vm-launcher --dry-run rejects the VM description "
                         "(exit %d): %s" % (p.returncode, p.stderr.strip()[-500:]))
            elif p.stdout.count("type='vhostuser'") + p.stdout.count('type="vhostuser"') \
                    < len(volumes):
                self.err(where, "the launcher's domain lacks vhostuser disks:\n" + p.stdout)
            else:
                self.note("qsd-vm-launcher --dry-run built the domain from the example's "
                          "VM description (%d vhostuser disk(s))" % len(volumes))
        finally:
            for s in socks:
                s.close()
            shutil.rmtree(tmp, ignore_errors=True)

    # ----------------------------------------------- StorageClass parameters
    def documented_params(self):
        """Parameter table of docs/storageclass.md: name -> allowed values."""
        path = os.path.join(self.root, "docs", "storageclass.md")
        out = {}
        try:
            text = open(path).read()
        except OSError as e:
            self.err("docs/storageclass.md", str(e))
            return out
        for line in text.splitlines():
            m = re.match(r"^\|\s*`([A-Za-z][A-Za-z0-9]*)`\s*\|([^|]*)\|", line)
            if m:
                out[m.group(1)] = [v.strip() for v in re.findall(r"`([^`]+)`", m.group(2))]
        if not out:
            self.err("docs/storageclass.md", "no parameter table found")
        return out

    def check_parameters(self):
        docs = self.documented_params()
        if set(docs) != set(PARAM_OPTION) | set(IMAGE_PARAMS):
            self.err("docs/storageclass.md", "documents %s; the plugin's parameters are %s" %
                     (sorted(docs), sorted(set(PARAM_OPTION) | set(IMAGE_PARAMS))))
        for name, (sub, opt) in PARAM_OPTION.items():
            text = self.qsdctl_help.get(sub)
            if text is None:
                continue
            line = next((l for l in text.splitlines() if l.strip().startswith(opt + " ")), None)
            if line is None:
                self.err("qsdctl %s --help" % sub, "no option %s (StorageClass %s)" % (opt, name))
                continue
            for v in docs.get(name, []):
                if re.fullmatch(r"\d+-\d+", v):
                    if v not in line:
                        self.err("docs/storageclass.md", "%s range %s not in `qsdctl %s "
                                 "--help`: %s" % (name, v, sub, line.strip()))
                elif not re.search(r"(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])" % re.escape(v), line):
                    self.err("docs/storageclass.md", "%s value %r is not accepted by qsdctl %s "
                             "%s (help: %s)" % (name, v, sub, opt, line.strip()))
        for _, _, sc in self.of_kind("StorageClass"):
            where = "StorageClass %s" % sc["metadata"]["name"]
            if (sc.get("parameters") or {}).get("backend") == "rbd":
                self.check_rbd_class(where, sc.get("parameters") or {})
                continue
            for k, v in (sc.get("parameters") or {}).items():
                if k.startswith("csi.storage.k8s.io/"):
                    continue
                if k not in docs:
                    self.err(where, "parameter %s is not documented in docs/storageclass.md" % k)
                    continue
                if k in IMAGE_PARAMS:
                    if not IMAGE_PARAMS[k].match(str(v)):
                        self.err(where, "%s=%r is not what the plugin accepts" % (k, v))
                    continue
                allowed = docs[k]
                rng = [a for a in allowed if re.fullmatch(r"\d+-\d+", a)]
                if rng:
                    lo, hi = map(int, rng[0].split("-"))
                    if not (str(v).isdigit() and lo <= int(v) <= hi):
                        self.err(where, "%s=%r outside %s" % (k, v, rng[0]))
                elif str(v) not in allowed:
                    self.err(where, "%s=%r, allowed: %s" % (k, v, ", ".join(allowed)))

    def check_secret_ref(self, where, params, which):
        """csi.storage.k8s.io/WHICH-secret-{name,namespace}: a Secret of
        deploy/ with the keys the plugin reads."""
        pre = "csi.storage.k8s.io/%s-secret-" % which
        name, ns = params.get(pre + "name"), params.get(pre + "namespace")
        if not name or not ns:
            self.err(where, "%sname and %snamespace are both needed" % (pre, pre))
            return
        sec = self.find("Secret", name, ns)
        if not sec:
            self.err(where, "%sname: no Secret %s/%s in deploy/" % (pre, ns, name))
            return
        keys = set(sec.get("stringData") or {}) | set(sec.get("data") or {})
        if not RBD_SECRET_KEYS <= keys:
            self.err("Secret %s/%s" % (ns, name), "lacks %s (docs/rbd.md)" %
                     ", ".join(sorted(RBD_SECRET_KEYS - keys)))

    def check_rbd_class(self, where, params):
        for k in params:
            if not k.startswith("csi.storage.k8s.io/") and k not in RBD_PARAMS:
                self.err(where, "parameter %s is not one of backend rbd (%s)" %
                         (k, ", ".join(sorted(RBD_PARAMS))))
        for k in ("clusterID", "pool"):
            if not params.get(k):
                self.err(where, "backend rbd needs the parameter %s" % k)
        ids = getattr(self, "rbd_cluster_ids", None)
        if ids is not None and params.get("clusterID") not in ids:
            self.err(where, "clusterID %r is not in the cluster file (%s)" %
                     (params.get("clusterID"), ", ".join(sorted(ids))))
        for which in RBD_SECRETS:
            self.check_secret_ref(where, params, which)

    def check_snapshot_classes(self):
        for _, _, vsc in self.of_kind("VolumeSnapshotClass"):
            params = vsc.get("parameters") or {}
            if any(k.startswith("csi.storage.k8s.io/snapshotter-secret-") for k in params):
                self.check_secret_ref("VolumeSnapshotClass %s" % vsc["metadata"]["name"],
                                      params, "snapshotter")

    def check_topology(self, plugin_bin):
        """Informational: does the plugin binary know the topology key yet?"""
        try:
            with open(plugin_bin, "rb") as fh:
                has = TOPOLOGY_KEY.encode() in fh.read()
        except OSError:
            return
        if not has:
            self.note("qsd-csi-plugin does not contain the topology key %s yet (no Node "
                      "service): the per-node provisioner needs NodeGetInfo to report it" %
                      TOPOLOGY_KEY)

    # ------------------------------------------------------------ releases
    def check_release_tags(self):
        """Our images carry the project() version of CMakeLists.txt, the tag
        scripts/build-images.sh gives besides the git version and the one a
        release bumps (README.md, "Versions and releases"): a manifest naming
        another tag would run an image no build made."""
        with open(os.path.join(self.root, "CMakeLists.txt")) as fh:
            m = re.search(r"^project\(qsd-csi VERSION ([0-9.]+)", fh.read(), re.M)
        if not m:
            self.err("CMakeLists.txt", "no project(qsd-csi VERSION ...)")
            return
        want = m.group(1)
        seen = 0
        for f, i, doc in self.docs:
            for c in _containers(doc) if isinstance(doc, dict) else []:
                image = str(c.get("image"))
                name, _, tag = image.rpartition(":")
                if not name.endswith(("/qsd-csi-plugin", "/qsd-vm-launcher")):
                    continue
                seen += 1
                if tag != want:
                    self.err("%s#%d" % (f, i), "container %s runs %s: our images are tagged "
                             "%s (CMakeLists.txt project() version)" % (c.get("name"), image,
                                                                         want))
        if not seen:
            self.err(KUSTOMIZATION, "no container runs qsd-csi-plugin or qsd-vm-launcher")

    def run(self):
        self.load()
        self.check_release_tags()
        self.check_shapes()
        self.check_containers()
        self.check_consistency()
        self.check_priority()
        self.check_rbac()
        self.check_node_endpoint()
        self.check_parameters()
        self.check_snapshot_classes()
        self.check_seccomp_profile()
        return not self.errors


def help_flags(binary, *sub):
    p = subprocess.run([binary, *sub, "--help"], capture_output=True, text=True, timeout=30)
    text = p.stdout + p.stderr
    if p.returncode != 0 or "usage" not in text.lower():
        raise RuntimeError("%s %s --help failed (exit %d): %s" %
                           (binary, " ".join(sub), p.returncode, text[:300]))
    return text, set(re.findall(r"--[a-z0-9][a-z0-9-]*", text))


def _containers(doc):
    if isinstance(doc, list):
        # A JSON patch (deploy/kubernetes/components/rbd): the containers it adds.
        return [op["value"] for op in doc if op.get("op") == "add" and
                str(op.get("path")).startswith("/spec/template/spec/containers/")]
    if doc.get("kind") in ("DaemonSet", "Deployment"):
        return doc["spec"]["template"]["spec"]["containers"]
    if doc.get("kind") == "Pod":
        return doc["spec"]["containers"]
    return []


def _edit_args(image_or_cmd, fn):
    """Mutation: apply fn(args) to the containers that run image_or_cmd: our
    binaries by their command (qsd-node-gate runs from the plugin's image),
    sidecars by their image."""
    def mutate(doc):
        for c in _containers(doc):
            cmd = os.path.basename(str((c.get("command") or [""])[0]))
            if (image_or_cmd == cmd) if cmd else (image_or_cmd in str(c.get("image"))):
                c["args"] = fn(list(c.get("args") or []))
    return mutate


def _edit_named(name, fn):
    """Mutation: apply fn(args) to the container called NAME."""
    def mutate(doc):
        for c in _containers(doc):
            if c.get("name") == name:
                c["args"] = fn(list(c.get("args") or []))
    return mutate


def _set_param(key, value):
    def mutate(doc):
        if doc.get("kind") == "StorageClass":
            doc.setdefault("parameters", {})[key] = value
    return mutate


def self_check(root, make_checker, with_launcher):
    """The checker must reject broken copies of our manifests."""
    ok = True
    ds = "deploy/kubernetes/30-node-daemonset.yaml"
    cases = [
        ("bogus plugin flag", "--bogus-flag", ds,
         _edit_args("qsd-csi-plugin", lambda a: a + ["--bogus-flag=1"])),
        ("driver name mismatch", "--driver-name", ds,
         _edit_args("qsd-csi-plugin", lambda a: [
             "--driver-name=other.example.com" if x.startswith("--driver-name") else x
             for x in a])),
        ("registrar socket mismatch", "--kubelet-registration-path", ds,
         _edit_args("node-driver-registrar", lambda a: [
             x.replace("/csi.sock", "/other.sock") if x.startswith("--kubelet-registration-path")
             else x for x in a])),
        ("node provisioner on the RBD socket", "the node's csi-provisioner serves local", ds,
         _edit_args("csi-provisioner", lambda a: [
             x.replace("/csi.sock", "/rbd.sock") for x in a])),
        ("no registrar of the RBD socket", "no node-driver-registrar registers", ds,
         _edit_named("node-driver-registrar-rbd", lambda a: [
             x.replace("/rbd.sock", "/csi.sock") for x in a])),
        ("sidecar flag that does not exist", "--node-deployment is not a flag", ds,
         _edit_args("livenessprobe", lambda a: a + ["--node-deployment=true"])),
        ("StorageClass value qsdctl refuses", "cache='fast'",
         "deploy/kubernetes/40-storageclass.yaml", _set_param("cache", "fast")),
        ("undocumented StorageClass parameter", "readOnly",
         "deploy/kubernetes/40-storageclass.yaml", _set_param("readOnly", "true")),
    ]
    cases.append(("value the plugin refuses", "refuses the manifest's arguments", ds,
                  _edit_args("qsd-csi-plugin", lambda a: [
                      "--log-level=verbose" if x.startswith("--log-level") else x for x in a])))
    cases.append(("duplicate YAML key", "already defined", "deploy/kubernetes/10-csidriver.yaml",
                  "  attachRequired: true\n"))
    rbac = "deploy/kubernetes/20-rbac.yaml"
    kust = "deploy/kubernetes/kustomization.yaml"
    ctl = "deploy/kubernetes/35-controller-deployment.yaml"
    ctl_rbd = "deploy/kubernetes/components/rbd/controller-sidecars.yaml"
    rbac_rbd = "deploy/kubernetes/components/rbd/rbac.yaml"
    rbd = "deploy/examples/rbd.yaml"

    def _ctl_privileged(d):
        for c in _containers(d):
            if c["name"] == "qsd-csi-plugin":
                c["securityContext"] = {"privileged": True}

    def _ctl_dev(d):
        if d.get("kind") == "Deployment":
            spec = d["spec"]["template"]["spec"]
            spec["volumes"].append({"name": "dev", "hostPath": {"path": "/dev"}})
            spec["containers"][0]["volumeMounts"].append({"name": "dev", "mountPath": "/dev"})

    def _ctl_unconfined_sidecar(d):
        for c in _containers(d):
            if c["name"] == "csi-provisioner":
                c["securityContext"]["seccompProfile"] = {"type": "Unconfined"}

    def _rbd_class(fn):
        def mutate(d):
            if d.get("kind") == "StorageClass" and d["parameters"].get("backend") == "rbd":
                fn(d)
        return mutate

    def _resizer_in_ds(d):
        if d.get("kind") == "DaemonSet":
            cs = d["spec"]["template"]["spec"]["containers"]
            r = dict(cs[-1])
            r["name"] = "csi-resizer"
            r["image"] = "registry.k8s.io/sig-storage/csi-resizer"
            r["args"] = ["--csi-address=/csi/csi.sock", "--leader-election=true",
                         "--http-endpoint=:9812"]
            cs.append(r)

    def _ctl_secrets_list(d):
        if d.get("kind") == "ClusterRole" and d["metadata"]["name"] == \
                "qsd-csi-controller-secrets":
            d["rules"][0]["verbs"] = ["get", "list", "watch"]

    def _old_snapshotter(d):
        for im in d.get("images") or []:
            if im["name"].endswith("/csi-snapshotter"):
                im["newTag"] = "v8.5.0"

    def _rule(role, resource, fn):
        def mutate(d):
            if d.get("kind") == "ClusterRole" and d["metadata"]["name"] == role:
                for r in d["rules"]:
                    if resource in r["resources"]:
                        r["verbs"] = fn(r["verbs"])
        return mutate

    def _whole_kubelet_root(d):
        if d.get("kind") == "DaemonSet":
            spec = d["spec"]["template"]["spec"]
            for v in spec["volumes"]:
                if v["name"] == "kubelet-pods":
                    v["hostPath"]["path"] = "/var/lib/kubelet"
            for m in spec["containers"][0]["volumeMounts"]:
                if m["name"] == "kubelet-pods":
                    m["mountPath"] = "/var/lib/kubelet"

    def _init_mkdir(d):
        if d.get("kind") == "DaemonSet":
            d["spec"]["template"]["spec"]["initContainers"] = [{
                "name": "prepare-dirs", "image": "qsd-csi-plugin",
                "command": ["/bin/mkdir", "-p", "/var/lib/qsd-csi/pool"],
                "securityContext": {"privileged": True},
                "volumeMounts": [{"name": "pool-dir", "mountPath": "/var/lib/qsd-csi/pool"}]}]

    def _unprivileged(name):
        def mutate(d):
            for c in _containers(d):
                if c["name"] == name:
                    c["securityContext"]["privileged"] = False
        return mutate

    def _priority(d):
        if d.get("kind") == "DaemonSet":
            d["spec"]["template"]["spec"]["priorityClassName"] = "system-node-critical"

    def _plugin_tag(d):
        for im in d.get("images") or []:
            if im["name"] == "qsd-csi-plugin":
                im["newTag"] = "0.0.9"

    cases += [
        ("plugin image at another tag than the project version", "CMakeLists.txt project()",
         kust, _plugin_tag),
        ("sidecar behind its latest release", "is not the release", kust, _old_snapshotter),
        ("resizer watching every pod", "--handle-volume-inuse-error=false is missing", ctl,
         _edit_args("csi-resizer", lambda a: [x for x in a if "inuse" not in x])),
        ("provisioner without snapshot source protection", "may not watch volumesnapshots",
         rbac, _rule("qsd-csi-provisioner", "volumesnapshots", lambda v: ["get", "list"])),
        ("RBAC broader than the sidecars need", "no sidecar needs it", rbac,
         _rule("qsd-csi-resizer", "persistentvolumeclaims", lambda v: v + ["delete"])),
        ("all of the kubelet root mounted", "all of the kubelet root", ds, _whole_kubelet_root),
        ("privileged init container", "privileged init container", ds, _init_mkdir),
        ("unprivileged sidecar", "not privileged", ds, _unprivileged("liveness-probe")),
        ("system-node-critical outside kube-system", "outside kube-system", ds, _priority),
        ("controller plugin privileged", "privileged or added capabilities", ctl,
         _ctl_privileged),
        ("controller with the host's /dev", "hostPath volume dev", ctl, _ctl_dev),
        ("controller sidecar without seccomp", "every container runs under RuntimeDefault", ctl_rbd,
         _ctl_unconfined_sidecar),
        ("controller plugin in the node role", "needs --role=controller", ctl,
         _edit_args("qsd-csi-plugin", lambda a: [x for x in a if not x.startswith("--role")])),
        ("central provisioner in node mode", "--node-deployment in the controller", ctl_rbd,
         _edit_args("csi-provisioner", lambda a: a + ["--node-deployment=true"])),
        ("central provisioner on the local name's socket", "must be on the RBD name's socket",
         ctl_rbd, _edit_args("csi-provisioner", lambda a: [
             x.replace("/rbd.sock", "/csi.sock") for x in a])),
        ("central snapshotter without leader election", "--leader-election=true is missing",
         ctl_rbd, _edit_args("csi-snapshotter", lambda a: [
             x for x in a if not x.startswith("--leader-election=")])),
        ("a resizer in the DaemonSet too", "a csi-resizer in the node DaemonSet", ds,
         _resizer_in_ds),
        ("controller may list Secrets", "no sidecar needs it", rbac_rbd, _ctl_secrets_list),
        ("RBD class waiting for a consumer", "must be Immediate", rbd,
         _rbd_class(lambda d: d.update(volumeBindingMode="WaitForFirstConsumer"))),
        ("RBD class without node-stage secret", "node-stage-secret-name and", rbd,
         _rbd_class(lambda d: d["parameters"].pop(
             "csi.storage.k8s.io/node-stage-secret-namespace"))),
        ("RBD class with a cluster the cluster file lacks", "is not in the cluster file", rbd,
         _rbd_class(lambda d: d["parameters"].update(clusterID="ceph-zz"))),
        ("RBD class with a local parameter", "is not one of backend rbd", rbd,
         _rbd_class(lambda d: d["parameters"].update(cache="none"))),
        ("PodMonitor scraping a port the pods lack", "no container port of that name",
         "deploy/monitoring/podmonitor-node.yaml",
         lambda d: d["spec"]["podMetricsEndpoints"][0].update(port="metricz")),
        ("PodMonitor selecting no pods", "selects no DaemonSet or Deployment",
         "deploy/monitoring/podmonitor-controller.yaml",
         lambda d: d["spec"]["selector"]["matchLabels"].update(
             {"app.kubernetes.io/name": "qsd-csi-ctrl"})),
        ("alert without severity", "severity not critical", "deploy/monitoring/prometheusrule.yaml",
         lambda d: d["spec"]["groups"][0]["rules"][0]["labels"].pop("severity")),
        ("metrics endpoint not on the metrics port", "is not the plugin's container port", ds,
         _edit_args("qsd-csi-plugin", lambda a: [
             "--http-endpoint=:9999" if x.startswith("--http-endpoint") else x for x in a])),
    ]
    # The node endpoint's gates.
    def _gate_sc(name, fn):
        def mutate(d):
            for c in _containers(d):
                if c["name"] == name:
                    fn(c["securityContext"])
        return mutate

    def _mount(container, volume, path, read_only=None):
        def mutate(d):
            for c in _containers(d):
                if c["name"] == container:
                    m = {"name": volume, "mountPath": path}
                    if read_only is not None:
                        m["readOnly"] = read_only
                    c.setdefault("volumeMounts", []).append(m)
        return mutate

    def _secret_writable(d):
        for c in _containers(d):
            for m in c.get("volumeMounts") or []:
                if m["name"] == "node-tls":
                    del m["readOnly"]

    def _nodes_rule(d):
        if d.get("kind") == "ClusterRole" and d["metadata"]["name"] == "qsd-csi-controller-nodes":
            d["rules"][0]["resources"] = ["namespaces"]

    def _arg(name, old, new):
        return _edit_named(name, lambda a: [new if x.startswith(old) else x for x in a])

    cases += [
        ("node gate keeping its other capabilities", "drop ALL capabilities", ds,
         _gate_sc("node-gate", lambda sc: sc["capabilities"].update(drop=[]))),
        ("node gate with a capability more", "more: ['NET_ADMIN']", ds,
         _gate_sc("node-gate", lambda sc: sc["capabilities"]["add"].append("NET_ADMIN"))),
        ("dial gate without SETPCAP", "missing: ['SETPCAP']", ctl,
         _gate_sc("node-dial-gate", lambda sc: sc["capabilities"]["add"].remove("SETPCAP"))),
        ("node gate allowed to escalate", "allowPrivilegeEscalation: false (no_new_privs", ds,
         _gate_sc("node-gate", lambda sc: sc.pop("allowPrivilegeEscalation"))),
        ("node gate started as a user", "runAsUser must be 0", ds,
         _gate_sc("node-gate", lambda sc: sc.update(runAsUser=65532))),
        ("node gate confined to root", "--uid '0'", ds, _arg("node-gate", "--uid=", "--uid=0")),
        ("node-operations socket directory in a sidecar", "container liveness-probe mounts "
         "node-ops-dir", ds, _mount("liveness-probe", "node-ops-dir", "/csi-ops")),
        ("dial socket directory in a sidecar", "container csi-resizer mounts dial-dir", ctl,
         _mount("csi-resizer", "dial-dir", "/dial")),
        ("node key in the plugin container too", "container qsd-csi-plugin mounts the Secret",
         ds, _mount("qsd-csi-plugin", "node-tls", "/etc/qsd-csi/node-tls", True)),
        ("node key Secret mounted writable", "must be mounted read-only", ds, _secret_writable),
        ("node gate on every address", "status.hostIP", ds,
         _arg("node-gate", "--listen=", "--listen=0.0.0.0:9830")),
        ("node gate forwarding elsewhere", "are not the same socket", ds,
         _arg("node-gate", "--forward=", "--forward=/csi-ops/other.sock")),
        ("node-operations socket group not the gate's", "is not the gate's --gid", ds,
         _edit_args("qsd-csi-plugin", lambda a: [
             "--node-ops-group=1000" if x.startswith("--node-ops-group") else x for x in a])),
        ("dial socket group not the plugin's", "could not connect", ctl,
         _gate_sc("node-dial-gate", lambda sc: sc.update(runAsGroup=0))),
        ("dial gate to another port", "the dial gates dial port 9831", ctl,
         _arg("node-dial-gate", "--port=", "--port=9831")),
        ("dial gate trusting another name", "the nodes' certificate names", ctl,
         _arg("node-dial-gate", "--peer-name=", "--peer-name=qsd-csi-controller")),
        ("API server as HOST:PORT", "--api-host", ctl,
         _arg("node-dial-gate", "--api-host=", "--api-host=10.96.0.1")),
        ("controller may not get Nodes", "may not get nodes", rbac, _nodes_rule),
        ("bogus gate flag", "not an option of qsd-node-gate", ds,
         _edit_named("node-gate", lambda a: a + ["--bogus-flag=1"])),
        ("value the gate refuses", "qsd-node-gate refuses the manifest's arguments", ds,
         _arg("node-gate", "--log-level=", "--log-level=verbose")),
    ]
    def _attach_group(d):
        if d.get("kind") == "Pod" and d["metadata"]["name"] == "demo-vm-attach-data":
            d["spec"]["securityContext"]["fsGroup"] = 108
    cases.append(("attachment pod with another fsGroup", "differs from the VM pod",
                  "deploy/examples/vm-pod.yaml", _attach_group))

    def _attach_other_vm(d):
        if d.get("kind") == "Pod" and d["metadata"]["name"] == "demo-vm-attach-data":
            for v in d["spec"]["volumes"]:
                if "csi" in v:
                    v["csi"]["volumeAttributes"]["hotplugInto"] = "no-such-vm"
    cases.append(("attachment pod naming an unknown VM pod", "no such pod in namespace",
                  "deploy/examples/vm-pod.yaml", _attach_other_vm))
    def _pvc_in_bridge(d):
        # The old layout: the PVC mounted inside the bridge, one directory.
        if d.get("kind") == "Pod" and d["metadata"]["name"] == "demo-vm":
            c = d["spec"]["containers"][0]
            c["args"] = [x for x in c["args"] if x != "--volumes-dir=/run/qsd-vm/volumes"]
            for m in c["volumeMounts"]:
                if m["name"] == "root-disk":
                    m["mountPath"] = "/run/qsd-vm/bridge/root"
    cases.append(("PVC mounted inside the bridge", "inside the bridge",
                  "deploy/examples/vm-pod.yaml", _pvc_in_bridge))

    def _bridge_writable(d):
        if d.get("kind") == "Pod" and d["metadata"]["name"] == "demo-vm":
            for m in d["spec"]["containers"][0]["volumeMounts"]:
                if m["name"] == "bridge":
                    del m["readOnly"]
    cases.append(("writable bridge mount", "must be readOnly: true",
                  "deploy/examples/vm-pod.yaml", _bridge_writable))

    def _vm_runtime_default(d):
        if d.get("kind") == "Pod" and d["metadata"]["name"] == "demo-vm":
            d["spec"]["securityContext"]["seccompProfile"] = {"type": "RuntimeDefault"}
    cases.append(("VM pod under RuntimeDefault", "seccompProfile must be",
                  "deploy/examples/vm-pod.yaml", _vm_runtime_default))

    def _no_seccomp_install(d):
        if d.get("kind") == "DaemonSet":
            d["spec"]["template"]["spec"].pop("initContainers", None)
    cases.append(("no seccomp profile installed", "seccomp profile to", ds, _no_seccomp_install))
    if with_launcher:
        cases.append(("bogus launcher flag", "--bogus-flag", "deploy/examples/vm-pod.yaml",
                      _edit_args("qsd-vm-launcher", lambda a: a + ["--bogus-flag=1"])))
        cases.append(("value the launcher refuses", "refuses the manifest's arguments",
                      "deploy/examples/vm-pod.yaml",
                      _edit_args("qsd-vm-launcher", lambda a: [
                          "--shutdown-timeout=forever" if x.startswith("--shutdown-timeout")
                          else x for x in a])))
    def run_case(case):
        label, expect, rel, mutate = case
        tmp = tempfile.mkdtemp(prefix="qsd-deploy-selfcheck-")
        try:
            shutil.copytree(os.path.join(root, "deploy"), os.path.join(tmp, "deploy"))
            shutil.copytree(os.path.join(root, "docs"), os.path.join(tmp, "docs"))
            shutil.copy(os.path.join(root, "CMakeLists.txt"), tmp)
            path = os.path.join(tmp, rel)
            if isinstance(mutate, str):
                # Raw text appended to the file (the last document's spec).
                with open(path, "a") as fh:
                    fh.write(mutate)
            else:
                with open(path) as fh:
                    docs = [d for d in yaml.safe_load_all(fh) if d is not None]
                for d in docs:
                    mutate(d)
                with open(path, "w") as fh:
                    yaml.safe_dump_all(docs, fh)
            ch = make_checker(tmp)
            if ch.run() or not any(expect in e for e in ch.errors):
                return False, "FAIL self-check (%s): not rejected as expected; errors: %s" % (
                    label, ch.errors)
            return True, "ok   self-check: %s rejected (%s)" % (
                label, next(e for e in ch.errors if expect in e))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # The cases are independent and wait on subprocesses (kubectl, our
    # binaries): a few at a time.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for good, line in pool.map(run_case, cases):
            print(line)
            ok = ok and good
    return ok


def settings_check(root, make_checker):
    """kustomization.yaml alone moves the kubelet root and the namespace: a
    copy with other values must pass, and its DaemonSet use only them."""
    tmp = tempfile.mkdtemp(prefix="qsd-deploy-settings-")
    try:
        shutil.copytree(os.path.join(root, "deploy"), os.path.join(tmp, "deploy"))
        shutil.copytree(os.path.join(root, "docs"), os.path.join(tmp, "docs"))
        shutil.copy(os.path.join(root, "CMakeLists.txt"), tmp)
        path = os.path.join(tmp, KUSTOMIZATION, "kustomization.yaml")
        with open(path) as fh:
            k = yaml.safe_load(fh)
        k["namespace"] = "storage-qsd"
        k["configMapGenerator"][0]["literals"] = ["kubeletRoot=/var/lib/k0s/kubelet"]
        with open(path, "w") as fh:
            yaml.safe_dump(k, fh)
        # deploy/monitoring follows with its own kustomization's namespace.
        mpath = os.path.join(tmp, MONITORING, "kustomization.yaml")
        with open(mpath) as fh:
            m = yaml.safe_load(fh)
        m["namespace"] = "storage-qsd"
        with open(mpath, "w") as fh:
            yaml.safe_dump(m, fh)
        ch = make_checker(tmp)
        ch.run()
        text = json.dumps([d for _, _, d in ch.docs if _ == "%s (kustomize)" % KUSTOMIZATION])
        problems = list(ch.errors)
        if "/var/lib/kubelet" in text:
            problems.append("/var/lib/kubelet is still in the rendered output")
        if '"qsd-csi"' in text.replace('"part-of": "qsd-csi"', ""):
            problems.append("the namespace qsd-csi is still in the rendered output")
        if problems:
            print("FAIL settings: kubeletRoot and namespace from kustomization.yaml: %s" %
                  problems)
            return False
        print("ok   settings: kubeletRoot=/var/lib/k0s/kubelet and namespace storage-qsd set "
              "in kustomization.yaml reach every object")
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--launcher")
    ap.add_argument("--qsdctl")
    ap.add_argument("--gate")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    a = ap.parse_args()
    root = os.path.abspath(a.root)

    helps = {}
    paths = {"qsd-csi-plugin": a.plugin}
    if a.launcher:
        paths["qsd-vm-launcher"] = a.launcher
    if a.gate:
        paths[GATE] = a.gate
    try:
        _, helps["qsd-csi-plugin"] = help_flags(a.plugin)
        if a.launcher:
            _, helps["qsd-vm-launcher"] = help_flags(a.launcher)
        if a.gate:
            _, helps[GATE] = help_flags(a.gate)
        qhelp = {}
        if a.qsdctl:
            for sub in ("create", "export"):
                qhelp[sub], _ = help_flags(a.qsdctl, sub)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        print("FAIL: %s" % e)
        return 1

    def make(r, quiet=True):
        return Checker(r, helps, launcher=a.launcher, qsdctl_help=qhelp, quiet=quiet,
                       paths=paths)

    try:
        ok = self_check(root, make, a.launcher is not None)
        ok = settings_check(root, make) and ok
        ch = make(root, quiet=False)
        good = ch.run()
    except render.KubectlMissing as e:
        print("SKIP: %s" % e)
        return 77
    if a.launcher is None:
        ch.note("launcher flags SKIPPED: no qsd-vm-launcher target in this build")
    if not a.qsdctl:
        ch.note("qsdctl not given: StorageClass values not checked against qsdctl --help")
    ch.check_topology(a.plugin)
    print("checked %d documents in %d files under deploy/" %
          (len(ch.docs), len({f for f, _, _ in ch.docs})))
    for n in ch.notes:
        print("note %s" % n)
    for e in ch.errors:
        print("FAIL %s" % e)
    return 0 if ok and good else 1


if __name__ == "__main__":
    sys.exit(main())
