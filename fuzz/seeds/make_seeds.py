#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ from real formats (run from fuzz/).

Kept in the repo so the seeds can be regenerated and extended; the ClientHellos come from
Python's own TLS stack (OpenSSL), the CSRs from the openssl CLI. Both are real encoders, not ours.
"""
import json, os, ssl, subprocess, tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")

def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

def j(v):
    return json.dumps(v, indent=2)

# --- CNI: primary plugins' results (bridge + host-local, Calico, Cilium) and our stdin ----------
bridge_result_10 = {"cniVersion": "1.0.0",
    "interfaces": [{"name": "cni0", "mac": "5a:2b:7c:11:22:33"}, {"name": "veth1a2b3c4d", "mac": "7e:01:02:03:04:05"},
                   {"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": "/var/run/netns/cni-1234"}],
    "ips": [{"interface": 2, "address": "10.244.1.5/24", "gateway": "10.244.1.1"},
            {"interface": 2, "address": "fd00:10:244:1::5/64", "gateway": "fd00:10:244:1::1"}],
    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}], "dns": {}}
calico_result_031 = {"cniVersion": "0.3.1", "interfaces": [{"name": "cali12345abcdef"}],
    "ips": [{"version": "4", "address": "192.168.53.7/32"}], "dns": {}}
cilium_result_11 = {"cniVersion": "1.1.0", "interfaces": [{"name": "lxc0a1b2c3d", "mac": "aa:bb:cc:dd:ee:ff", "mtu": 1500},
    {"name": "eth0", "sandbox": "/var/run/netns/x", "mtu": 1500}],
    "ips": [{"address": "10.0.1.23/32", "gateway": "10.0.1.1", "interface": 1}],
    "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.1.1", "mtu": 1450, "table": 100, "scope": 0}], "dns": {"nameservers": ["10.96.0.10"]}}
ours = {"type": "cnimesh-cni", "stateDir": "/var/lib/cnimesh", "nodeAgent": {"socket": "/var/run/cnimesh/node.sock"}}
for i, (v, prev) in enumerate([("1.0.0", bridge_result_10), ("0.3.1", calico_result_031), ("1.1.0", cilium_result_11),
                               ("0.4.0", bridge_result_10), ("0.3.0", calico_result_031)]):
    put("cni_netconf", f"chained-{v}-{i}.json", j(dict(ours, cniVersion=v, name="k8s-pod-network", prevResult=prev)))
put("cni_netconf", "all-settings.json", j({"cniVersion": "1.0.0", "name": "net", "type": "cnimesh-cni",
    "inboundProxyPort": 4143, "outboundProxyPort": 4140, "proxyUID": 2102, "proxyGID": 2102,
    "skipInboundPorts": [4190, 4191, "4567-4568"], "skipOutboundPorts": [443, "6443"],
    "skipInboundSubnets": ["10.0.0.0/8"], "skipOutboundSubnets": ["fd00::/8"], "backend": "iptables-nft",
    "excludeNamespaces": ["kube-system"], "logLevel": "debug", "runtimeConfig": {"portMappings": []}}))
put("cni_netconf", "gc-1.1.0.json", j({"cniVersion": "1.1.0", "name": "net", "type": "cnimesh-cni",
    "cni.dev/valid-attachments": [{"containerID": "abc", "ifname": "eth0"}]}))
put("cni_netconf", "ancient-prev.json", j({"cniVersion": "1.0.0", "name": "net", "type": "cnimesh-cni",
    "prevResult": {"ip4": {"ip": "10.1.0.2/24"}}}))

put("cni_args", "containerd", "K8S_POD_UID=9f8e7d6c-1234-4321-abcd-0123456789ab;IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-7d4b9c-x2x9z;K8S_POD_INFRA_CONTAINER_ID=4f1c2b3a")
put("cni_args", "podman", "IgnoreUnknown=1;K8S_POD_NAME=web")
put("cni_args", "env-add", "ADD\n4f1c2b3a9d8e\n/var/run/netns/cni-1234\neth0\nIgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p")
put("cni_args", "env-del", "DEL\n4f1c2b3a9d8e\n\neth0\n")
put("cni_args", "env-gc", "GC\n\n\n\n")

put("cni_state_record", "record-v1.json", j({"version": 1, "network": "k8s-pod-network", "containerID": "4f1c2b3a9d8e",
    "ifname": "eth0", "netns": "/var/run/netns/cni-1234", "netnsId": {"dev": 4, "ino": 4026532512},
    "podNamespace": "shop", "podName": "web-0", "podUid": "9f8e7d6c", "backend": "nftables",
    "spec": {"inboundProxyPort": 4143, "outboundProxyPort": 4140, "proxyUID": 2102, "skipInboundPorts": [4190, 4191, "4567-4568"],
             "skipOutboundPorts": [443, 6443], "skipInboundSubnets": [], "skipOutboundSubnets": ["10.96.0.0/12"]},
    "createdAt": 1763900000}))
put("cni_state_record", "record-iptables.json", j({"version": 1, "network": "cbr0", "containerID": "../evil_id",
    "ifname": "net1", "netns": "/proc/1234/ns/net", "backend": "iptables-legacy",
    "spec": {"inboundProxyPort": 4143, "outboundProxyPort": 4140, "proxyUID": 2102, "proxyGID": 2102, "skipInboundPorts": [],
             "skipOutboundPorts": [], "skipInboundSubnets": ["fd00::/8"], "skipOutboundSubnets": []}, "createdAt": 0}))

# --- node agent: primary CNI configurations, as the CNIs' installers write them ---------------
# The first byte picks the file extension: 0 .conflist, 1 .conf, 2 .json.
calico = {"name": "k8s-pod-network", "cniVersion": "0.3.1", "plugins": [
    {"type": "calico", "log_level": "info", "log_file_path": "/var/log/calico/cni/cni.log", "datastore_type": "kubernetes",
     "nodename": "node-1", "mtu": 0, "ipam": {"type": "calico-ipam"}, "policy": {"type": "k8s"},
     "kubernetes": {"kubeconfig": "/etc/cni/net.d/calico-kubeconfig"}},
    {"type": "portmap", "snat": True, "capabilities": {"portMappings": True}},
    {"type": "bandwidth", "capabilities": {"bandwidth": True}}]}
cilium = {"cniVersion": "0.3.1", "name": "cilium", "type": "cilium-cni", "enable-debug": False,
          "log-file": "/var/run/cilium/cilium-cni.log"}
flannel = {"name": "cbr0", "cniVersion": "0.3.1", "plugins": [
    {"type": "flannel", "delegate": {"hairpinMode": True, "isDefaultGateway": True}},
    {"type": "portmap", "capabilities": {"portMappings": True}}]}
bridge = {"cniVersion": "1.0.0", "name": "bridge", "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]],
              "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": True}},
    {"type": "firewall"}, {"type": "tuning", "sysctl": {"net.core.somaxconn": "500"}}]}
chained = dict(flannel, plugins=flannel["plugins"] + [ours])
twice = dict(calico, plugins=[ours] + calico["plugins"] + [dict(ours, logLevel="debug")])
kindnet = {"cniVersion": "0.3.1", "name": "kindnet", "plugins": [
    {"type": "ptp", "ipMasq": False, "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state",
     "routes": [{"dst": "0.0.0.0/0"}], "ranges": [[{"subnet": "10.244.0.0/24"}]]}, "mtu": 1500},
    {"type": "portmap", "capabilities": {"portMappings": True}}]}
bridge_conf = {"cniVersion": "0.4.0", "name": "mynet", "type": "bridge", "bridge": "cni0", "isGateway": True,
               "ipMasq": True, "ipam": {"type": "host-local", "subnet": "10.22.0.0/16", "routes": [{"dst": "0.0.0.0/0"}]}}
for name, ext, v in [("calico", 0, calico), ("cilium", 1, cilium), ("flannel", 0, flannel), ("bridge", 0, bridge),
                     ("already-chained", 0, chained), ("chained-twice", 0, twice), ("kindnet", 0, kindnet),
                     ("bridge-conf", 1, bridge_conf), ("cilium-json", 2, cilium)]:
    put("node_conflist", name, bytes([ext]) + j(v).encode())

# --- proxy ------------------------------------------------------------------------------------
heads = {
    "get": b"GET / HTTP/1.1\r\nHost: web.shop.svc.cluster.local\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
    "post": b"POST /api/v1/orders?id=7 HTTP/1.1\r\nHost: orders:8080\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    "http10": b"GET /healthz HTTP/1.0\r\n\r\n",
    "upgrade": b"GET /ws HTTP/1.1\r\nHost: chat\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    "connect": b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    "absolute": b"GET http://web.shop:80/x HTTP/1.1\r\nHost: web.shop\r\n\r\n",
    "lf-only": b"GET / HTTP/1.1\nHost: x\n\n",
    "h2-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00\x00\x00\x00\x00",
    "redis": b"*1\r\n$4\r\nPING\r\n",
    "ssh": b"SSH-2.0-OpenSSH_9.6\r\n",
}
for k, v in heads.items():
    put("proxy_detect", k, v)
    put("proxy_http1_head", k, v)

def client_hello(**kw):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if kw.get("tls12"):
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if kw.get("alpn"):
        ctx.set_alpn_protocols(kw["alpn"])
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    s = ctx.wrap_bio(inc, out, server_hostname=kw.get("sni"))
    try:
        s.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()

hellos = {
    "tls13-mesh-sni": client_hello(sni="web.shop.serviceaccount.identity.cnimesh.cluster.local", alpn=["h2", "http/1.1"]),
    "tls12-sni": client_hello(sni="api.example.com", tls12=True),
    "no-sni": client_hello(sni=None),
    "alpn-h2": client_hello(sni="Upper.Case.Example", alpn=["h2"]),
}
for k, v in hellos.items():
    put("proxy_client_hello", k, v)
    put("proxy_detect", "tls-" + k, v)
# One split across two records, as some clients send large hellos.
body = hellos["tls13-mesh-sni"][5:]
split = b"\x16\x03\x01" + len(body[:100]).to_bytes(2, "big") + body[:100] + b"\x16\x03\x01" + len(body[100:]).to_bytes(2, "big") + body[100:]
put("proxy_client_hello", "split-records", split)

# flags byte (0: HTTP/2), then the URI line, then headers.
for name, uri, hdrs in [
    ("h11", "http://web.shop.svc.cluster.local:8080/api?x=1", ["l5d-orig-proto: HTTP/1.1", "te: trailers"]),
    ("h10-absolute", "http://web:80/", ["l5d-orig-proto: HTTP/1.0; absolute-form", "user-agent: curl"]),
    ("bad", "/x", ["l5d-orig-proto: HTTP/3"]),
    ("two", "http://a/", ["l5d-orig-proto: HTTP/1.1", "l5d-orig-proto: HTTP/1.1"]),
    ("plain-h2", "http://grpc.shop:9090/pkg.Svc/Method", ["content-type: application/grpc", "te: trailers"]),
]:
    put("proxy_orig_proto", name, b"\x00" + "\n".join([uri] + hdrs).encode())

# --- trace context: W3C Trace Context examples and B3 (single and multi), valid and not -------------
tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
for name, lines in {
    "w3c-sampled": [f"traceparent: 00-{tid}-{sid}-01", "tracestate: rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"],
    "w3c-unsampled": [f"traceparent: 00-{tid}-{sid}-00"],
    "w3c-future": [f"traceparent: cc-{tid}-{sid}-01-what-the-future-will-be-like"],
    "w3c-ff": [f"traceparent: ff-{tid}-{sid}-01"],
    "w3c-zero": [f"traceparent: 00-{'0' * 32}-{sid}-01"],
    "w3c-upper": [f"traceparent: 00-{tid.upper()}-{sid}-01"],
    "w3c-twice": [f"traceparent: 00-{tid}-{sid}-01", f"traceparent: 00-{tid}-{sid}-00", "b3: 1"],
    "b3-single": [f"b3: {tid}-{sid}-1-{sid}"],
    "b3-single-64": [f"b3: a3ce929d0e0e4736-{sid}-d"],
    "b3-deny": ["b3: 0"],
    "b3-multi": [f"X-B3-TraceId: {tid}", f"X-B3-SpanId: {sid}", f"X-B3-ParentSpanId: {sid}", "X-B3-Sampled: 1", "X-B3-Flags: 1"],
    "b3-multi-bad": [f"X-B3-TraceId: {tid}", "X-B3-Sampled: true"],
    "both": [f"traceparent: 00-{tid}-{sid}-01", f"b3: {tid}-{sid}-0"],
}.items():
    put("trace_context", name, "\n".join(lines))

# --- control ----------------------------------------------------------------------------------
ident = "web.shop.serviceaccount.identity.cnimesh.cluster.local"
with tempfile.TemporaryDirectory() as tmp:
    def csr(name, keyargs, cn, san, extra=()):
        key = os.path.join(tmp, name + ".key")
        subprocess.run(["openssl", "genpkey", *keyargs, "-out", key], check=True, capture_output=True)
        args = ["openssl", "req", "-new", "-key", key, "-subj", f"/CN={cn}", "-outform", "DER"]
        if san:
            args += ["-addext", f"subjectAltName={san}"]
        for e in extra:
            args += ["-addext", e]
        der = subprocess.run(args, check=True, capture_output=True).stdout
        put("control_csr", name + ".der", der)
        return der
    p256 = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
    der = csr("p256-ok", p256, ident, f"DNS:{ident}")
    pem = subprocess.run(["openssl", "req", "-inform", "DER", "-outform", "PEM"], input=der, check=True, capture_output=True).stdout
    put("control_csr", "p256-ok.pem", pem)
    csr("ed25519-ok", ["-algorithm", "ED25519"], ident, f"DNS:{ident}")
    csr("p384", ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"], ident, f"DNS:{ident}")
    csr("wrong-san", p256, ident, "DNS:other.shop.serviceaccount.identity.cnimesh.cluster.local")
    csr("two-sans", p256, ident, f"DNS:{ident},IP:10.0.0.1")
    csr("ca", p256, ident, f"DNS:{ident}", ["basicConstraints=critical,CA:TRUE"])
    csr("no-san", p256, ident, None)

pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-7d4b9c-", "namespace": "shop",
       "labels": {"app": "web", "pod-template-hash": "7d4b9c"}, "annotations": {"cnimesh.io/inject": "enabled"},
       "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c", "uid": "1", "controller": True}]},
       "spec": {"serviceAccountName": "web", "containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}]}}
put("control_inject", "deployment-pod", b"\x00" + j(pod).encode())
full = dict(pod)
full["metadata"] = dict(pod["metadata"], annotations={"cnimesh.io/inject": "enabled",
    "config.cnimesh.io/opaque-ports": "3306,5432-5433", "config.cnimesh.io/proxy-log-level": "debug",
    "config.cnimesh.io/skip-outbound-ports": "25"})
full["spec"] = dict(pod["spec"], initContainers=[{"name": "migrate", "image": "migrate:1"}],
    volumes=[{"name": "data", "emptyDir": {}}], securityContext={"runAsUser": 1000},
    containers=pod["spec"]["containers"] + [{"name": "metrics", "image": "exporter:2", "securityContext": {"runAsUser": 2102}}])
put("control_inject", "full-pod-native", b"\x02" + j(full).encode())
put("control_inject", "hostnetwork-optin", b"\x01" + j(dict(pod, spec=dict(pod["spec"], hostNetwork=True))).encode())
review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
    "uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "", "version": "v1", "kind": "Pod"},
    "resource": {"group": "", "version": "v1", "resource": "pods"}, "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
    "requestResource": {"group": "", "version": "v1", "resource": "pods"}, "name": "", "namespace": "shop", "operation": "CREATE",
    "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller", "groups": ["system:serviceaccounts"]},
    "object": pod, "oldObject": None, "dryRun": False, "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}}}
put("control_inject", "review", b"\x00" + j(review).encode())
put("control_inject", "review-update", b"\x00" + j(dict(review, request=dict(review["request"], operation="UPDATE"))).encode())

for i, p in enumerate(["web.shop.svc.cluster.local:80", "web.shop:8080", "Web.Shop.svc.cluster.local.:443", "10.1.2.3:8080",
                       "[fd00::1]:443", "corp.example\nweb.shop.svc.corp.example:80", "web.shop.svc.cluster.local", "web:http"]):
    put("control_destination_path", f"path-{i}", p)

# Objects as the API server sends them to the control plane's Kubernetes source (one per input):
# the kinds it watches, Gateway API routes (GAMMA) as the Gateway API's own examples write them.
KUBE_OBJECTS = [('server-api-http.json', {'apiVersion': 'policy.cnimesh.io/v1alpha1', 'kind': 'Server', 'metadata': {'name': 'api-http', 'namespace': 'shop'},
   'spec': {'podSelector': {'matchLabels': {'app': 'api'}}, 'port': 'http', 'proxyProtocol': 'HTTP/1'}}),
 ('networkauthentication-pods.json', {'apiVersion': 'policy.cnimesh.io/v1alpha1', 'kind': 'NetworkAuthentication',
   'metadata': {'name': 'pods', 'namespace': 'shop'}, 'spec': {'networks': [{'cidr': '10.0.0.0/16', 'except': ['10.0.9.0/24']}]}}),
 ('service-a.json', {'apiVersion': 'v1', 'kind': 'Service', 'metadata': {'name': 'a'}}),
 ('pod-web-0.json',
  {'apiVersion': 'v1',
   'kind': 'Pod',
   'metadata': {'name': 'web-0', 'namespace': 'shop', 'labels': {'app': 'web'}},
   'spec': {'serviceAccountName': 'web',
            'containers': [{'name': 'web', 'image': 'nginx'},
                           {'name': 'cnimesh-proxy', 'image': 'ghcr.io/cnimesh/cnimesh-proxy:0.1.0'}]},
   'status': {'podIP': '10.244.1.5', 'podIPs': [{'ip': '10.244.1.5'}, {'ip': 'fd00::5'}]}}),
 ('httproute-api-canary.json',
  {'apiVersion': 'gateway.networking.k8s.io/v1',
   'kind': 'HTTPRoute',
   'metadata': {'name': 'api-canary',
                'namespace': 'shop',
                'annotations': {'retry.cnimesh.io/http': '5xx,gateway-error',
                                'retry.cnimesh.io/limit': '2',
                                'timeout.cnimesh.io/request': '10s'}},
   'spec': {'parentRefs': [{'group': '', 'kind': 'Service', 'name': 'api', 'port': 80}],
            'hostnames': ['api.shop', '*.example.com'],
            'rules': [{'matches': [{'path': {'type': 'PathPrefix', 'value': '/v1'},
                                    'method': 'GET',
                                    'headers': [{'name': 'x-user', 'type': 'RegularExpression', 'value': '^a.*'}],
                                    'queryParams': [{'name': 'page', 'value': '2'}]}],
                       'filters': [{'type': 'RequestHeaderModifier',
                                    'requestHeaderModifier': {'set': [{'name': 'x-route', 'value': 'canary'}],
                                                              'remove': ['x-debug']}},
                                   {'type': 'URLRewrite', 'urlRewrite': {'hostname': 'api.internal'}}],
                       'backendRefs': [{'name': 'api', 'port': 80, 'weight': 90},
                                       {'name': 'api-v2', 'namespace': 'canary', 'port': 8080, 'weight': 10}],
                       'timeouts': {'request': '5s', 'backendRequest': '1s'},
                       'retry': {'codes': [502, 503, 504], 'attempts': 3, 'backoff': '100ms'}},
                      {'matches': [{'path': {'type': 'Exact', 'value': '/old'}}],
                       'filters': [{'type': 'RequestRedirect',
                                    'requestRedirect': {'scheme': 'https',
                                                        'path': {'type': 'ReplaceFullPath', 'replaceFullPath': '/new'},
                                                        'statusCode': 301}}]}]}}),
 ('grpcroute-items.json',
  {'apiVersion': 'gateway.networking.k8s.io/v1',
   'kind': 'GRPCRoute',
   'metadata': {'name': 'items', 'namespace': 'shop', 'annotations': {'retry.cnimesh.io/grpc': 'unavailable,internal'}},
   'spec': {'parentRefs': [{'group': '', 'kind': 'Service', 'name': 'api'}],
            'rules': [{'matches': [{'method': {'service': 'shop.Items', 'method': 'Get'},
                                    'headers': [{'name': 'x-tenant', 'value': 'a'}]}],
                       'backendRefs': [{'name': 'api-v2', 'port': 9090}]}]}}),
 ('referencegrant-shop-routes.json',
  {'apiVersion': 'gateway.networking.k8s.io/v1beta1',
   'kind': 'ReferenceGrant',
   'metadata': {'name': 'shop-routes', 'namespace': 'canary'},
   'spec': {'from': [{'group': 'gateway.networking.k8s.io', 'kind': 'HTTPRoute', 'namespace': 'shop'}],
            'to': [{'group': '', 'kind': 'Service', 'name': 'api-v2'}]}}),
 ('service-web.json',
  {'apiVersion': 'v1',
   'kind': 'Service',
   'metadata': {'name': 'web', 'namespace': 'shop', 'annotations': {'config.cnimesh.io/opaque-ports': '5432'}},
   'spec': {'clusterIP': '10.96.12.34',
            'ports': [{'name': 'http', 'port': 80, 'targetPort': 8080},
                      {'name': 'db', 'port': 5432, 'targetPort': 'db'}]}}),
 ('endpointslice-web-abc12.json',
  {'apiVersion': 'discovery.k8s.io/v1',
   'kind': 'EndpointSlice',
   'metadata': {'name': 'web-abc12', 'namespace': 'shop', 'labels': {'kubernetes.io/service-name': 'web'}},
   'addressType': 'IPv4',
   'ports': [{'name': 'http', 'port': 8080, 'protocol': 'TCP'}],
   'endpoints': [{'addresses': ['10.244.1.5'],
                  'conditions': {'ready': True, 'serving': True, 'terminating': False},
                  'targetRef': {'kind': 'Pod', 'name': 'web-0', 'namespace': 'shop'},
                  'nodeName': 'node-1'}]})]
for name, obj in KUBE_OBJECTS:
    put("control_kube_objects", name, j(obj))

# --- Inbound authorization paths: probes with queries, encodings, dot segments, ambiguous ones --
for i, p in enumerate(["/ready", "/ready?verbose=1", "/%61dmin", "/public/../admin", "/public/%2e%2e/admin",
                       "//admin", "/a/./b/.", "/admin%2fx", "/a%5cb", "/a\\b", "/..", "/a/b/../../..", "/%25%32%65",
                       "/api/v1/users?id=1", "*", "http://web:80/x/../y", "/sp%20ace/%7euser", "/a%2"], start=1):
    put("proxy_authz_path", f"seed-{i}", p)
