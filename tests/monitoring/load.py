#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""deploy/monitoring in a real Prometheus (ctest deploy/monitoring_load):
the PrometheusRule's groups and the dashboard's queries, over a real
qsd-csi-plugin's /metrics.

A plugin with a local volume created, staged and published (PVC labels from
the provisioner's parameters, as test_csi_metrics.py does) and one failing
call (so that there are RPC errors to show); a Prometheus (the server
tests/monitoring/run.sh builds, a temporary TSDB, 1 s scrape and evaluation
intervals) scraping it as the node PodMonitor does (job qsd-csi-node,
honor_labels, the target labels node, pod and namespace the operator's
relabelling gives), with the PrometheusRule's spec.groups as a rules file.
Checked, each wait bounded:

  1. the target is up;
  2. every group of the PrometheusRule is loaded and evaluated (after the
     first scrape) with every rule's health "ok" and no lastError;
  3. every query of the dashboard (Grafana's variables replaced: by ".*",
     as run.sh does, and by the volume's own node, namespace and PVC)
     answers status success with at least one sample, each with the labels
     its legend names, non-empty; the variables' label_values() find the
     volume's node, namespace and PVC;
  4. self-checks, through the same checks: a planted group whose rule joins
     many series to one without group_left must be reported (health err,
     lastError); a rules file that does not parse (an unknown function),
     loaded by a reload, must be refused and its group reported missing.

Prometheus and the plugin are stopped by PID and the temporary directories
removed, also on failure.  Runtime: about 20 s.

usage: load.py PROMETHEUS PLUGIN PROTO_DIR
"""
import calendar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "csi"))
import csilib  # noqa: E402
import thinlib  # noqa: E402
from csilib import mount_cap  # noqa: E402
import grpc  # noqa: E402
import yaml  # noqa: E402

MiB = 1 << 20
VOL = "pvc-promload"
NAMESPACE, PVC = "vms", "disk-a"
PVC_META = {"csi.storage.k8s.io/pvc/name": PVC,
            "csi.storage.k8s.io/pvc/namespace": NAMESPACE,
            "csi.storage.k8s.io/pv/name": VOL}
WAIT_S = 60  # bound on each wait (Prometheus start, first scrape, evaluations)
PLANTED = "selfcheck.label-matching"
UNPARSABLE = "selfcheck.unparsable"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Prometheus:
    def __init__(self, binary, work, target_port, node):
        self.work = work
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        os.mkdir(os.path.join(work, "rules"))
        with open(os.path.join(work, "prometheus.yml"), "w") as f:
            yaml.safe_dump({
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                           "evaluation_interval": "1s"},
                "rule_files": [os.path.join(work, "rules", "*.yaml")],
                "scrape_configs": [{
                    # What the PodMonitor qsd-csi-node becomes: job from the
                    # pod's app.kubernetes.io/name, honorLabels, node relabelled
                    # from the pod's node, pod and namespace from the operator.
                    "job_name": "qsd-csi-node",
                    "honor_labels": True,
                    "metrics_path": "/metrics",
                    "static_configs": [{
                        "targets": ["127.0.0.1:%d" % target_port],
                        "labels": {"node": node, "pod": "qsd-csi-node-test",
                                   "namespace": "qsd-csi"}}]}]}, f)
        self.log = open(os.path.join(work, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [binary, "--config.file", os.path.join(work, "prometheus.yml"),
             "--storage.tsdb.path", os.path.join(work, "tsdb"),
             "--web.listen-address", "127.0.0.1:%d" % self.port, "--web.enable-lifecycle"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def request(self, path, params=None, method="GET"):
        """(HTTP status, decoded JSON or text) of one call."""
        url = self.base + path
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        req = urllib.request.Request(url, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                status, body = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read().decode()
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    def api(self, path, params=None):
        status, body = self.request("/api/v1/" + path, params)
        assert status == 200 and isinstance(body, dict) and body.get("status") == "success", \
            "%s %s: HTTP %d %s" % (path, params or "", status, str(body)[:500])
        return body["data"]

    def wait_ready(self):
        deadline = time.monotonic() + WAIT_S
        while True:
            if self.proc.poll() is not None:
                raise AssertionError("prometheus exited with %d:\n%s" %
                                     (self.proc.returncode, self.log_tail()))
            try:
                if self.request("/-/ready")[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("prometheus not ready within %d s" % WAIT_S)
            time.sleep(0.2)

    def log_tail(self, n=40):
        self.log.flush()
        with open(os.path.join(self.work, "prometheus.log"), errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


def wait_for(what, fn, bound=WAIT_S):
    """fn's first true value, polled every 0.25 s for at most bound seconds;
    on timeout the last value fn returned is named in the error."""
    deadline = time.monotonic() + bound
    while True:
        r = fn()
        if r:
            return r
        if time.monotonic() > deadline:
            raise AssertionError("not within %d s: %s" % (bound, what))
        time.sleep(0.25)


def rfc3339(ts):
    """Prometheus' timestamps (nanoseconds, Z) as seconds since the epoch."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z", ts)
    assert m, ts
    return calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + \
        float(m.group(2) or 0)


def rule_problems(groups, expected):
    """What is wrong with the loaded rule groups: each of expected (name ->
    number of rules) missing, or with a rule whose health is not "ok" or
    that has a lastError.  [] when all is well."""
    found = {g["name"]: g for g in groups}
    out = []
    for name, n in expected.items():
        g = found.get(name)
        if g is None:
            out.append("group %s: not loaded" % name)
            continue
        if len(g["rules"]) != n:
            out.append("group %s: %d rules loaded, %d in the file" % (name, len(g["rules"]), n))
        for r in g["rules"]:
            if r.get("health") != "ok" or r.get("lastError"):
                out.append("group %s, %s: health %s, lastError %r" % (
                    name, r.get("name"), r.get("health"), r.get("lastError")))
    return out


def check_rules(prom, shipped, since):
    """2 and the first self-check."""
    def evaluated():
        groups = prom.api("rules")["groups"]
        late = [g for g in groups if not g.get("lastEvaluation", "").startswith("0001") and
                rfc3339(g["lastEvaluation"]) > since]
        return groups if len(late) == len(groups) == len(shipped) + 1 else None
    groups = wait_for("every rule group evaluated after the first scrape", evaluated)
    planted = rule_problems(groups, {PLANTED: 1})
    assert len(planted) == 1 and "group_left" in planted[0], \
        "self-check: the planted many-to-one join was not reported: %s" % planted
    print("ok   self-check: a rule that fails to evaluate is reported: " + planted[0])
    bad = rule_problems(groups, shipped)
    assert not bad, "rule groups of the PrometheusRule:\n  " + "\n  ".join(bad)
    for g in groups:
        if g["name"] in shipped:
            print("ok   group %s: %d rules, health ok, evaluated in %.1f ms (%s)" % (
                g["name"], len(g["rules"]), g["evaluationTime"] * 1000,
                ", ".join("%s %s" % (r["name"], r.get("state", "")) for r in g["rules"])))


def dashboard_queries():
    """[(panel title, expr, legend labels)] and the variables' label_values()
    as [(name, metric selector, label)]."""
    with open(os.path.join(ROOT, "deploy/monitoring/qsd-csi-dashboard.json")) as f:
        dash = json.load(f)
    queries = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            queries.append((p["title"], t["expr"],
                            re.findall(r"\{\{ *([a-zA-Z_][a-zA-Z0-9_]*) *\}\}",
                                       t.get("legendFormat", ""))))
    variables = []
    for v in dash["templating"]["list"]:
        m = re.match(r"label_values\((.*), *(\w+)\)$", v.get("definition", ""))
        if m:
            variables.append((v["name"], m.group(1), m.group(2)))
    return queries, variables


def grafana(expr, values):
    """expr with Grafana's variables replaced: $__rate_interval by 5m (as
    run.sh does), $name by values[name]."""
    expr = expr.replace("$__rate_interval", "5m")
    return re.sub(r"\$([a-z_]+)", lambda m: values[m.group(1)], expr)


def query_problems(prom, queries, values):
    """What is wrong with the answers to queries, variables set to values."""
    out = []
    for title, expr, legend in queries:
        q = grafana(expr, values)
        try:
            data = prom.api("query", {"query": q})
        except AssertionError as e:
            out.append("%s (%s): %s" % (title, values["node"], e))
            continue
        if not data["result"]:
            out.append("%s (%s): no sample: %s" % (title, values["node"], q))
        for s in data["result"]:
            missing = [lb for lb in legend if not s["metric"].get(lb)]
            if missing:
                out.append("%s (%s): a sample without %s (its legend's): %s" % (
                    title, values["node"], ", ".join(missing), s["metric"]))
    return out


def check_dashboard(prom, node):
    """3."""
    queries, variables = dashboard_queries()
    assert len(queries) >= 20, "only %d queries in the dashboard" % len(queries)
    per_volume = sum("qsd_csi_volume_" in e for _, e, _ in queries)
    assert per_volume >= 10, "only %d per-volume queries" % per_volume
    any_value = {"node": ".*", "namespace": ".*", "pvc": ".*"}
    mine = {"node": node, "namespace": NAMESPACE, "pvc": PVC}
    last = []

    def all_answer():
        # rate() needs two scrapes in its window: retried until it has them.
        last[:] = query_problems(prom, queries, any_value) + \
            query_problems(prom, queries, mine)
        return not last
    try:
        wait_for("every dashboard query with a sample", all_answer, bound=30)
    except AssertionError:
        raise AssertionError("dashboard queries:\n  " + "\n  ".join(last))
    print("ok   %d dashboard queries (%d over per-volume series) answer with samples "
          "labelled as their legends need, with the variables .* and %s" % (
              len(queries), per_volume, mine))
    for name, selector, label in variables:
        got = prom.api("label/%s/values" % label,
                       {"match[]": grafana(selector, any_value)})
        assert mine[name] in got, "variable %s: label_values(%s, %s) = %s" % (
            name, selector, label, got)
        print("ok   variable %s: label_values(%s, %s) = %s" % (name, selector, label, got))


def check_unparsable(prom, shipped):
    """The second self-check: a rules file that does not parse is refused on
    reload and its group reported missing by the same check."""
    with open(os.path.join(prom.work, "rules", "unparsable.yaml"), "w") as f:
        yaml.safe_dump({"groups": [{"name": UNPARSABLE, "rules": [
            {"alert": "Unparsable", "expr": "no_such_function(qsd_csi_pool_free_bytes) > 0"}]}]},
            f)
    status, body = prom.request("/-/reload", method="POST")
    assert status != 200, "self-check: a reload with an unparsable rule was accepted"
    why = [line for line in prom.log_tail(20).splitlines() if "no_such_function" in line]
    assert why, "self-check: the refused reload does not name the unparsable rule:\n" + \
        prom.log_tail(20)
    bad = rule_problems(prom.api("rules")["groups"], dict(shipped, **{UNPARSABLE: 1}))
    assert bad == ["group %s: not loaded" % UNPARSABLE], \
        "self-check: the unparsable group was not the one problem: %s" % bad
    print("ok   self-check: an unparsable rule is refused (reload: HTTP %d; log: %s) and "
          "reported: %s" % (status, why[-1][-200:], bad[0]))


def main():
    prometheus, plugin, proto_dir = sys.argv[1:4]
    with open(os.path.join(ROOT, "deploy/monitoring/prometheusrule.yaml")) as f:
        groups = yaml.safe_load(f)["spec"]["groups"]
    shipped = {g["name"]: len(g["rules"]) for g in groups}
    env = csilib.Env(plugin, proto_dir, prefix="qsd-promload-")
    work = tempfile.mkdtemp(prefix="qsd-promload-prom-")
    csilib.ctest_register_root(work)
    prom = None
    try:
        mport = free_port()
        c = env.start(["--http-endpoint", "127.0.0.1:%d" % mport, "--metrics-interval", "1",
                       "--overcommit-ratio", "1.5"])
        thinlib.create_published(env, c, VOL, 64 * MiB, mount_cap(env.pb), 60, PVC_META)
        # One failing call: the dashboard's "RPC errors" has something to show.
        csilib.expect_code(c.NodeStageVolume, env.pb.NodeStageVolumeRequest(volume_id=""),
                           grpc.StatusCode.INVALID_ARGUMENT, "stage without an id")

        prom = Prometheus(prometheus, work, mport, env.node)
        with open(os.path.join(work, "rules", "qsd-csi.yaml"), "w") as f:
            yaml.safe_dump({"groups": groups}, f, sort_keys=False)
        # Self-check: every QSD state series joined to the volume's one
        # capacity series without group_left fails at evaluation.
        with open(os.path.join(work, "rules", "planted.yaml"), "w") as f:
            yaml.safe_dump({"groups": [{"name": PLANTED, "rules": [
                {"record": "selfcheck:join", "expr":
                 "qsd_csi_volume_qsd_state * on (volume_id) qsd_csi_volume_capacity_bytes"}]}]},
                f)
        prom.wait_ready()
        info = prom.api("status/buildinfo")
        print("ok   prometheus ready on %s (%s, %s; go install sets no version)" % (
            prom.base, prometheus, info["goVersion"]))

        def target_up():
            t = prom.api("targets")["activeTargets"]
            return t if t and all(x["health"] == "up" for x in t) else None
        targets = wait_for("the plugin's target up", target_up)
        assert len(targets) == 1, targets
        t = targets[0]
        print("ok   target %s up (job %s, node %s, scraped in %.1f ms)" % (
            t["scrapeUrl"], t["labels"]["job"], t["labels"].get("node"),
            t["lastScrapeDuration"] * 1000))
        check_rules(prom, shipped, rfc3339(t["lastScrape"]))
        check_dashboard(prom, env.node)
        check_unparsable(prom, shipped)
    except Exception:
        if prom:
            print("---- prometheus log (tail)\n" + prom.log_tail())
        print("---- plugin log (tail)\n" + env.log_tail(40))
        raise
    finally:
        if prom:
            prom.stop()
        env.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(csilib.run_main(main))
