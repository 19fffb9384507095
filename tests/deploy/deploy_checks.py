"""Checks of what deploy/ ships, as functions that return a list of problems (empty = clean), so
that test_deploy.py can run them on the real files and on broken copies (each check must be able
to fail).

What is checked: Kubernetes manifests (kinds and apiVersions, names, namespaces, selectors against
pod labels, Services against pods and their ports, volume mounts against volumes, Secrets,
ConfigMaps and PersistentVolumeClaims that pods reference against the ones shipped, every
container flag against the binary's own --help, file paths under a Secret mount against the
Secret's keys, GPU requests, Prometheus annotations), systemd units (ExecStart flags, credential
paths, hardening options) and daemon config examples (keys are flags).
"""
import ipaddress
import re
import shlex
import subprocess

import yaml

NAMESPACE = "furnace"
API_VERSIONS = {
    "Namespace": "v1",
    "Service": "v1",
    "PersistentVolumeClaim": "v1",
    "ConfigMap": "v1",
    "Secret": "v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1",
}
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
BINARIES = ("furnace-controller", "furnace-worker")


def help_flags(binary):
    """The long flags `binary --help` lists (CLI11's layout: `  -h,--help`, `  --listen TEXT`)."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{binary} --help exited {out.returncode}: {out.stderr}")
    return set(re.findall(r"^\s+(?:-\w,)?(--[A-Za-z0-9][\w-]*)", out.stdout, re.M))


def parse_args(args):
    """[(flag, value or None)] of a command line; `--f=v` and `--f v` both."""
    pairs = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            if "=" in a:
                flag, value = a.split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                flag, value = a, args[i + 1]
                i += 1
            else:
                flag, value = a, None
            pairs.append((flag, value))
        i += 1
    return pairs


def insecure_flags(where, args):
    return [f"{where}: --insecure in a shipped deployment" for flag, _ in parse_args(args)
            if flag == "--insecure"]


def _is_wildcard(address):
    """A listen address on every interface (0.0.0.0, [::], ":7070"), which nobody can dial."""
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
    if host == "":
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def advertise_problems(where, args):
    """The controller refuses a wildcard --listen without --advertise (workers would dial 0.0.0.0
    for rendezvous): a shipped command line that listens on one must say the address to dial."""
    given = dict(parse_args(args))
    listen = given.get("--listen")  # absent: the --config file's, or 127.0.0.1:7070
    if listen is not None and _is_wildcard(listen) and not given.get("--advertise"):
        return [f"{where}: --listen {listen} listens on every interface and has no --advertise "
                "(the address workers and ranks dial; the controller refuses to start without it)"]
    return []


def unknown_flags(where, binary_name, args, flags_of):
    known = flags_of[binary_name]
    return [f"{where}: {binary_name} has no flag {flag} (its --help lists: "
            f"{', '.join(sorted(known))})"
            for flag, _ in parse_args(args) if flag not in known]


def load_manifests(paths):
    """[(file, document)] of every YAML document in `paths` (empty documents dropped)."""
    docs = []
    for path in paths:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    docs.append((str(path), doc))
    return docs


def _name(doc):
    return (doc.get("metadata") or {}).get("name", "")


def _pod_specs(docs):
    """(where, workload doc, pod template) of every workload."""
    for path, doc in docs:
        if doc.get("kind") in WORKLOADS:
            template = (doc.get("spec") or {}).get("template") or {}
            yield f"{path}: {doc['kind']} {_name(doc)}", doc, template


def check_objects(docs):
    problems = []
    seen = set()
    for path, doc in docs:
        kind = doc.get("kind")
        where = f"{path}: {kind} {_name(doc)!r}"
        if kind not in API_VERSIONS:
            problems.append(f"{where}: unexpected kind (allowed: {', '.join(API_VERSIONS)})")
            continue
        if doc.get("apiVersion") != API_VERSIONS[kind]:
            problems.append(f"{where}: apiVersion {doc.get('apiVersion')!r}, "
                            f"expected {API_VERSIONS[kind]!r}")
        name = _name(doc)
        if not DNS_LABEL.match(name) or len(name) > 63:
            problems.append(f"{where}: metadata.name is not a DNS-1123 label")
        namespace = (doc.get("metadata") or {}).get("namespace")
        if kind != "Namespace" and namespace != NAMESPACE:
            problems.append(f"{where}: metadata.namespace {namespace!r}, expected {NAMESPACE!r}")
        if (kind, name) in seen:
            problems.append(f"{where}: defined twice")
        seen.add((kind, name))
    return problems


def check_workloads(docs, flags_of):
    problems = []
    by_kind = {}
    for _, doc in docs:
        by_kind.setdefault(doc.get("kind"), {})[_name(doc)] = doc
    for where, doc, template in _pod_specs(docs):
        spec = doc.get("spec") or {}
        match = (spec.get("selector") or {}).get("matchLabels") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        if not match:
            problems.append(f"{where}: spec.selector.matchLabels is empty")
        for k, v in match.items():
            if labels.get(k) != v:
                problems.append(f"{where}: selector {k}={v} does not match the pod template's "
                                f"labels {labels}")
        if doc["kind"] == "StatefulSet":
            svc = by_kind.get("Service", {}).get(spec.get("serviceName"))
            if svc is None or (svc.get("spec") or {}).get("clusterIP") != "None":
                problems.append(f"{where}: serviceName {spec.get('serviceName')!r} is not a "
                                "headless Service in these manifests")
        pod = template.get("spec") or {}
        volumes = {v.get("name"): v for v in pod.get("volumes") or []}
        for v in volumes.values():
            problems += _check_volume_source(where, v, by_kind, pod.get("securityContext") or {})
        for c in pod.get("containers") or []:
            cwhere = f"{where} container {c.get('name')!r}"
            problems += _check_container(cwhere, c, volumes, by_kind, flags_of)
    return problems


def _check_volume_source(where, volume, by_kind, pod_security):
    problems = []
    if "secret" in volume and pod_security.get("runAsNonRoot"):
        # Secret files belong to root (group: the pod's fsGroup): a non-root user reads them
        # through the group bit, with an fsGroup.
        mode = volume["secret"].get("defaultMode", 0o644)
        if not (mode & 0o004 or (mode & 0o040 and "fsGroup" in pod_security)):
            problems.append(f"{where}: volume {volume['name']!r}: defaultMode {mode:#o} leaves "
                            "the Secret unreadable to the pod's non-root user (use 0440 and an "
                            "fsGroup)")
    if "secret" in volume:
        name = volume["secret"].get("secretName")
        secret = by_kind.get("Secret", {}).get(name)
        if secret is None:
            problems.append(f"{where}: volume {volume['name']!r} uses Secret {name!r}, which the "
                            "template does not define")
        else:
            keys = set((secret.get("stringData") or {}).keys()) | set(
                (secret.get("data") or {}).keys())
            for item in volume["secret"].get("items") or []:
                if item.get("key") not in keys:
                    problems.append(f"{where}: volume {volume['name']!r} projects key "
                                    f"{item.get('key')!r}, not in Secret {name!r} "
                                    f"(keys: {', '.join(sorted(keys))})")
    if "configMap" in volume:
        name = volume["configMap"].get("name")
        if name not in by_kind.get("ConfigMap", {}):
            problems.append(f"{where}: volume {volume['name']!r} uses ConfigMap {name!r}, which "
                            "is not defined")
    if "persistentVolumeClaim" in volume:
        name = volume["persistentVolumeClaim"].get("claimName")
        if name not in by_kind.get("PersistentVolumeClaim", {}):
            problems.append(f"{where}: volume {volume['name']!r} claims {name!r}, which is not "
                            "defined")
    return problems


def _files_of_volume(volume, by_kind):
    """Paths a Secret or ConfigMap volume puts under its mount, or None for other volumes."""
    for source, kind, key in (("secret", "Secret", "secretName"), ("configMap", "ConfigMap", "name")):
        if source in volume:
            items = volume[source].get("items")
            if items:
                return {i.get("path") for i in items}
            obj = by_kind.get(kind, {}).get(volume[source].get(key)) or {}
            return set((obj.get("stringData") or {}).keys()) | set((obj.get("data") or {}).keys())
    return None


def _check_container(where, c, volumes, by_kind, flags_of):
    problems = []
    command = c.get("command") or []
    binary = command[0].rsplit("/", 1)[-1] if command else ""
    furnace_image = str(c.get("image", "")).startswith("furnace:")
    if furnace_image and binary not in flags_of:
        problems.append(f"{where}: command {command} is not one of {', '.join(BINARIES)}")
        return problems
    args = [str(a) for a in c.get("args") or []]
    if furnace_image:
        problems += unknown_flags(where, binary, args, flags_of)
        problems += insecure_flags(where, args)
    env = {e.get("name") for e in c.get("env") or []}
    for a in args:
        for var in re.findall(r"\$\((\w+)\)", a):
            if var not in env:
                problems.append(f"{where}: argument {a!r} uses $({var}), not set in env")
    mounts = {}
    for m in c.get("volumeMounts") or []:
        if m.get("name") not in volumes:
            problems.append(f"{where}: volumeMount {m.get('name')!r} has no volume of that name "
                            f"(volumes: {', '.join(sorted(volumes))})")
        else:
            mounts[m.get("mountPath", "").rstrip("/")] = volumes[m.get("name")]
    for flag, value in parse_args(args):
        if not value or not value.startswith("/"):
            continue
        for mount_path, volume in mounts.items():
            if value.startswith(mount_path + "/"):
                files = _files_of_volume(volume, by_kind)
                rel = value[len(mount_path) + 1:]
                if files is not None and rel not in files:
                    problems.append(f"{where}: {flag}={value}: {rel!r} is not a file of volume "
                                    f"{volume['name']!r} (it holds: {', '.join(sorted(files))})")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    if binary == "furnace-worker":
        # A volume's mount point is the kubelet's (root's, group-writable under fsGroup), which
        # the agent refuses as its work directory: it must be a directory below it, which the
        # agent makes (0700).
        work_dir = (dict(parse_args(args)).get("--work-dir") or "").rstrip("/")
        if work_dir in mounts:
            problems.append(f"{where}: --work-dir={work_dir} is a volume's mount point, which the "
                            "agent refuses (not its own, group-writable); give a directory below it")
        limits = (c.get("resources") or {}).get("limits") or {}
        if int(limits.get("nvidia.com/gpu", 0)) < 1:
            problems.append(f"{where}: a worker must request nvidia.com/gpu in resources.limits")
    if binary == "furnace-controller":
        problems += advertise_problems(where, args)
        listen = dict(parse_args(args)).get("--metrics-listen") or ""
        if listen and not listen.startswith("127.0.0.1:"):
            problems.append(f"{where}: --metrics-listen {listen} must stay on 127.0.0.1 (the HTTP "
                            "listener has no TLS; the controller refuses it without --insecure)")
    return problems


def check_services(docs):
    problems = []
    pods = [(where, template) for where, _, template in _pod_specs(docs)]
    for path, doc in docs:
        if doc.get("kind") != "Service":
            continue
        where = f"{path}: Service {_name(doc)!r}"
        selector = (doc.get("spec") or {}).get("selector") or {}
        selected = [t for _, t in pods
                    if selector and all(((t.get("metadata") or {}).get("labels") or {}).get(k) == v
                                        for k, v in selector.items())]
        if not selected:
            problems.append(f"{where}: selector {selector} matches no pod template")
            continue
        names = set()
        numbers = set()
        for t in selected:
            for c in (t.get("spec") or {}).get("containers") or []:
                for p in c.get("ports") or []:
                    names.add(p.get("name"))
                    numbers.add(p.get("containerPort"))
        for p in (doc.get("spec") or {}).get("ports") or []:
            target = p.get("targetPort", p.get("port"))
            if target not in names and target not in numbers:
                problems.append(f"{where}: targetPort {target!r} is no container port of the "
                                f"pods it selects (ports: {sorted(map(str, names | numbers))})")
    return problems


def check_prometheus_annotations(docs):
    problems = []
    found = False
    for where, _, template in _pod_specs(docs):
        ann = (template.get("metadata") or {}).get("annotations") or {}
        if ann.get("prometheus.io/scrape") != "true":
            continue
        found = True
        port = ann.get("prometheus.io/port")
        ports = {str(p.get("containerPort")) for c in (template.get("spec") or {}).get(
            "containers") or [] for p in c.get("ports") or []}
        if port not in ports:
            problems.append(f"{where}: prometheus.io/port {port!r} is no container port "
                            f"({', '.join(sorted(ports))})")
        if ann.get("prometheus.io/path") != "/metrics":
            problems.append(f"{where}: prometheus.io/path must be /metrics")
    if not found:
        problems.append("no pod template carries prometheus.io/scrape: \"true\"")
    return problems


def check_secret_template(docs):
    """Secrets only in the template, and there only placeholders (no key material)."""
    problems = []
    for path, doc in docs:
        if doc.get("kind") != "Secret":
            continue
        if not path.endswith(".template.yaml"):
            problems.append(f"{path}: Secret {_name(doc)!r} outside a *.template.yaml file")
        for key, value in ((doc.get("stringData") or {}) | (doc.get("data") or {})).items():
            if "BEGIN" in str(value) or not str(value).startswith("<"):
                problems.append(f"{path}: Secret {_name(doc)!r} key {key!r} holds a value, not "
                                "a <placeholder>")
    return problems


def systemd_exec_start(unit_text):
    """The ExecStart command line of a unit (continuation lines joined) as a list of words."""
    text = re.sub(r"\\\n", " ", unit_text)
    m = re.search(r"^ExecStart=(.*)$", text, re.M)
    return shlex.split(m.group(1)) if m else []


def systemd_settings(unit_text):
    settings = {}
    for line in re.sub(r"\\\n", " ", unit_text).splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            k, v = line.split("=", 1)
            settings.setdefault(k.strip(), []).append(v.strip())
    return settings


HARDENING = {
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes",
    "CapabilityBoundingSet": "", "ProtectHome": "yes", "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes", "ProtectControlGroups": "yes", "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes", "SystemCallArchitectures": "native",
}


# The open-file limit the units give: systemd's default soft limit (1024) ran out at about a
# thousand agents on the controller (each daemon raises its soft limit to this hard limit).
OPEN_FILES = 1048576


# The directory flags each daemon writes under (the rest it only reads).
WRITTEN_DIRS = {"furnace-controller": ("--state-dir",),
                "furnace-worker": ("--work-dir", "--checkpoint-root")}


def check_systemd_unit(name, unit_text, flags_of):
    problems = []
    argv = systemd_exec_start(unit_text)
    binary = argv[0].rsplit("/", 1)[-1] if argv else ""
    if binary not in flags_of:
        return [f"{name}: ExecStart runs {binary!r}, not one of {', '.join(BINARIES)}"]
    problems += unknown_flags(name, binary, argv[1:], flags_of)
    problems += insecure_flags(name, argv[1:])
    if binary == "furnace-controller":
        problems += advertise_problems(name, argv[1:])
    settings = systemd_settings(unit_text)
    for key, want in HARDENING.items():
        if want not in settings.get(key, []):
            problems.append(f"{name}: hardening option {key}={want} missing")
    if str(OPEN_FILES) not in settings.get("LimitNOFILE", []):
        problems.append(f"{name}: LimitNOFILE={OPEN_FILES} missing (the default 1024 runs out)")
    credentials = {}
    for c in settings.get("LoadCredential", []):
        cred, _, source = c.partition(":")
        credentials[cred] = source
        if not source.startswith("/etc/furnace/"):
            problems.append(f"{name}: LoadCredential {c}: the file is not under /etc/furnace/")
    needed = {"--tls-ca", "--tls-cert", "--tls-key", "--join-token-file"}
    given = dict(parse_args(argv[1:]))
    for flag in sorted(needed - set(given)):
        problems.append(f"{name}: ExecStart lacks {flag}")
    for flag, value in given.items():
        if value and value.startswith("${CREDENTIALS_DIRECTORY}/"):
            cred = value.split("/", 1)[1]
            if cred not in credentials:
                problems.append(f"{name}: {flag} {value}: no LoadCredential={cred}:...")
    writable = [p for v in settings.get("ReadWritePaths", []) for p in v.split()]
    writable += ["/var/lib/" + d for v in settings.get("StateDirectory", []) for d in v.split()]
    for flag in WRITTEN_DIRS[binary]:
        value = given.get(flag)
        if value and not any(value == w or value.startswith(w.rstrip("/") + "/")
                             for w in writable):
            problems.append(f"{name}: {flag} {value} is not writable under ProtectSystem=strict "
                            "(add it to ReadWritePaths or StateDirectory)")
    return problems


def check_config_keys(name, text, binary, flags_of):
    doc = yaml.safe_load(text) or {}
    return [f"{name}: key {key!r} is no flag of {binary}" for key in doc
            if f"--{key}" not in flags_of[binary]]


def check_metrics_proxy(docs):
    """The controller pod's TLS proxy: it forwards to the controller's --metrics-listen port,
    listens on the port Prometheus is pointed at, and its certificate files are files of the
    volumes mounted in its container."""
    problems = []
    conf = next((d for _, d in docs if d.get("kind") == "ConfigMap" and
                 _name(d) == "furnace-metrics-proxy"), None)
    if conf is None:
        return ["no ConfigMap furnace-metrics-proxy"]
    text = "\n".join((conf.get("data") or {}).values())
    by_kind = {}
    for _, doc in docs:
        by_kind.setdefault(doc.get("kind"), {})[_name(doc)] = doc
    for where, _, template in _pod_specs(docs):
        pod = template.get("spec") or {}
        containers = {c.get("name"): c for c in pod.get("containers") or []}
        proxy = containers.get("metrics-proxy")
        if proxy is None:
            continue
        ann = (template.get("metadata") or {}).get("annotations") or {}
        controller = next((c for c in containers.values()
                           if (c.get("command") or [""])[0].endswith("furnace-controller")), {})
        listen = dict(parse_args([str(a) for a in controller.get("args") or []])).get(
            "--metrics-listen", "")
        upstream = re.findall(r"proxy_pass\s+http://([\d.]+:\d+)/", text)
        if upstream != [listen]:
            problems.append(f"{where}: the proxy forwards to {upstream}, the controller's "
                            f"--metrics-listen is {listen!r}")
        if re.findall(r"listen\s+(\d+)\s+ssl", text) != [ann.get("prometheus.io/port")]:
            problems.append(f"{where}: the proxy does not listen (ssl) on prometheus.io/port "
                            f"{ann.get('prometheus.io/port')}")
        volumes = {v.get("name"): v for v in pod.get("volumes") or []}
        mounts = {m.get("mountPath"): volumes.get(m.get("name"), {})
                  for m in proxy.get("volumeMounts") or []}
        for path in re.findall(r"ssl_\w+\s+(/\S+);", text):
            mount, _, rel = path.rpartition("/")
            files = _files_of_volume(mounts.get(mount, {}), by_kind)
            if not files or rel not in files:
                problems.append(f"{where}: the proxy reads {path}, which no volume mounted in "
                                "its container provides")
    return problems
