#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora, fuzz/corpus/TARGET/, from the golden captures
(shared/golden/*.jsonl: the `raw` field of each frame record, the CSR an edgecore sent) and
the config files. Small on purpose (the committed corpus stays well under 1 MB): libFuzzer
grows its own working corpus under target/fuzz/. Run: python3 fuzz/seeds.py [GOLDEN_DIR]."""
import base64, glob, hashlib, hmac, json, os, random, shutil, struct, sys

here = os.path.dirname(os.path.abspath(__file__))
golden = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, '..', '..', 'shared', 'golden')
out = os.path.join(here, 'corpus')
rng = random.Random(21)


def write(target, name, data):
    os.makedirs(os.path.join(out, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(out, target, name), 'wb') as f:
        f.write(data)


shutil.rmtree(out, ignore_errors=True)

# Frames: one per distinct (direction, operation, resource kind), smallest first.
frames = {}
for path in sorted(glob.glob(os.path.join(golden, '*.jsonl'))):
    for line in open(path):
        record = json.loads(line)
        raw = record.get('raw')
        if record.get('opcode') != 'text' or not isinstance(raw, str):
            continue
        try:
            route = json.loads(raw).get('route', {})
        except ValueError:
            continue
        kind = '/'.join(t for t in route.get('resource', '').split('/') if t in (
            'pod', 'node', 'configmap', 'secret', 'membership', 'detail', 'twin', 'device',
            'nodestatus', 'podstatus', 'event', 'lease', 'service', 'endpoints', 'podlist'))
        key = (record.get('dir'), route.get('operation'), route.get('group'), kind)
        if key not in frames or len(raw) < len(frames[key]):
            frames[key] = raw
raws = sorted(frames.values(), key=len)[:48]
for i, raw in enumerate(raws):
    write('frame', f'golden-{i:02}', raw)

# Resources: every route.resource seen, in edge and cloud form.
resources = set()
for raw in frames.values():
    resource = json.loads(raw).get('route', {}).get('resource', '')
    if resource:
        resources.add(resource)
        resources.add('node/edge-2/' + resource)
for i, resource in enumerate(sorted(resources)[:80]):
    write('resource', f'golden-{i:02}', resource)

# Tokens, signed with the key fuzz_targets/token.rs verifies with.
key, ca = b'edgehive fuzz key', b'edgehive fuzz ca'
b64 = lambda data: base64.urlsafe_b64encode(data).rstrip(b'=').decode()


def jwt(claims, header='{"alg":"HS256","typ":"JWT"}', key=key):
    signing = b64(header.encode()) + '.' + b64(claims.encode())
    return signing + '.' + b64(hmac.new(key, signing.encode(), hashlib.sha256).digest())


ca_hash = hashlib.sha256(ca).hexdigest()
for name, token in {
    'valid': jwt('{"exp":2000000000}'),
    'float-exp': jwt('{"exp":2.0e9}'),
    'expired': jwt('{"exp":1}'),
    'no-exp': jwt('{}'),
    'other-key': jwt('{"exp":2000000000}', key=b'other'),
    'alg-none': jwt('{"exp":2000000000}', header='{"alg":"none"}'),
    'join': ca_hash + '.' + jwt('{"exp":2000000000}'),
    'join-wrong-ca': '00' * 32 + '.' + jwt('{"exp":2000000000}'),
    'golden-bad': 'bad.token.x',
}.items():
    write('token', name, token)

# The CSR edgecore sent for edge-2, and variants of its NodeName.
for line in open(os.path.join(golden, 'http-cert-bootstrap-edge-2.jsonl')):
    request = json.loads(line)['request']
    if request.get('body_b64'):
        der = base64.b64decode(request['body_b64'])
        write('csr', 'golden-edge-2', b'edge-2\n' + der)
        write('csr', 'golden-no-node', der)
        write('csr', 'golden-other-node', b'edge-3\n' + der)
        write('csr', 'golden-bad-node', b'Edge_2\n' + der)

# Config files: KubeEdge's defaults and minimal files, and edgehive's documented ones.
for path in sorted(glob.glob(os.path.join(golden, '*config.yaml'))):
    write('config', 'golden-' + os.path.basename(path), open(path, 'rb').read())
for name in ('cloud.yaml', 'edge.yaml'):
    path = os.path.join(here, '..', 'config', name)
    if os.path.exists(path):
        write('config', 'edgehive-' + name, open(path, 'rb').read())


# WebSocket bytes as an edge sends them (masked, RFC 6455), after a read-size byte.
def ws(opcode, payload, fin=True):
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack('>H', n)
    else:
        head += bytes([0x80 | 127]) + struct.pack('>Q', n)
    mask = bytes(rng.randrange(256) for _ in range(4))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


small = [r.encode() for r in raws[:6]]
write('ws_frames', 'one-text', b'\xff' + ws(1, small[0]))
write('ws_frames', 'texts-1-byte-reads', b'\x00' + b''.join(ws(1, r) for r in small[:3]))
mid = small[1]
write('ws_frames', 'continuation', b'\x10' + ws(1, mid[:20], fin=False) + ws(0, mid[20:40], fin=False) + ws(0, mid[40:]))
write('ws_frames', 'ping-pong-close', b'\x40' + ws(9, b'hi') + ws(10, b'hi') + ws(8, struct.pack('>H', 1000) + b'bye'))
write('ws_frames', 'binary', b'\x08' + ws(2, bytes(range(200))))
write('ws_frames', 'large-header', b'\x20' + ws(1, raws[-1].encode()))

# Tunnel messages (EdgeStream <-> CloudStream): one per (direction, type), smallest first,
# from the stream captures' base64 payloads, and two malformed ones.
tunnel = {}
for path in sorted(glob.glob(os.path.join(golden, 'stream-tunnel*.jsonl'))):
    for line in open(path):
        record = json.loads(line)
        if 'tunnel' not in record or 'b64' not in record:
            continue
        payload = base64.b64decode(record['b64'])
        key = (record['dir'], record['tunnel']['type_name'])
        if key not in tunnel or len(payload) < len(tunnel[key]):
            tunnel[key] = payload
for (direction, name), payload in sorted(tunnel.items()):
    write('tunnel', f"golden-{'up' if direction == 'edge->cloud' else 'down'}-{name.lower()}", payload)
write('tunnel', 'varint-overflow', b'\xff' * 10 + b'\x01\x03')
write('tunnel', 'unknown-type', b'\x01\x07data')

# Rules (the Router): a REST call's path, then a Rule or RuleEndpoint as the API server
# sends it (KubeEdge's examples: rest -> eventbus, eventbus -> rest, rest -> servicebus).
def rule(name, source, source_resource, target, target_resource):
    return json.dumps({'apiVersion': 'rules.kubeedge.io/v1', 'kind': 'Rule',
                       'metadata': {'name': name, 'namespace': 'default'},
                       'spec': {'source': source, 'sourceResource': source_resource,
                                'target': target, 'targetResource': target_resource},
                       'status': {'successMessages': 3, 'failMessages': 1, 'errors': ['x']}})


def endpoint(name, kind, properties=None):
    return json.dumps({'apiVersion': 'rules.kubeedge.io/v1', 'kind': 'RuleEndpoint',
                       'metadata': {'name': name, 'namespace': 'default'},
                       'spec': {'ruleEndpointType': kind, 'properties': properties or {}}})


for name, (path, obj) in {
    'rest-to-eventbus': ('/edge-1/default/a', rule('r1', 'my-rest', {'path': '/a'}, 'my-eventbus', {'topic': 'test'})),
    'rest-param': ('/edge-1/default/a/b/c', rule('r2', 'my-rest', {'path': '/a/{id}'}, 'my-eventbus', {'topic': 'test/'})),
    'eventbus-to-rest': ('node/edge-1/default/test-1', rule('r3', 'my-eventbus', {'topic': 'test-1', 'node_name': 'edge-1'}, 'my-rest', {'resource': 'http://127.0.0.1:8080/up'})),
    'rest-to-servicebus': ('/edge-1/default/svc', rule('r4', 'my-rest', {'path': '/svc'}, 'my-servicebus', {'path': '/api'})),
    'endpoint-servicebus': ('/edge-1/default', endpoint('my-servicebus', 'servicebus', {'service_port': '6666'})),
    'endpoint-rest': ('//default/a', endpoint('my-rest', 'rest')),
    'bad-path': ('/Edge/../a/+/#', rule('r5', 'my-rest', {'path': 7}, 'x', None)),
}.items():
    write('rule', name, path + '\n' + obj)

# Topics (EventBus): a filter, a topic and a node name, one a line.
for name, lines in {
    'twin-update': ['$hw/events/device/+/twin/update', '$hw/events/device/thermo-1/twin/update', 'edge-1'],
    'twin-get': ['$hw/events/device/+/twin/get', '$hw/events/device/d/twin/get', 'edge-1'],
    'state-update': ['$hw/events/device/+/state/update', '$hw/events/device/d/state/update', 'edge-1'],
    'membership-get': ['$hw/events/node/edge-1/membership/get', '$hw/events/node/edge-1/membership/get', 'edge-1'],
    'upload': ['$hw/events/upload/#', '$hw/events/upload/records/1', 'edge-1'],
    'upload-records': ['SYS/dis/upload_records', 'SYS/dis/upload_records', 'edge-1'],
    'user-tree': ['+/user/#', 'default/user/temperature', 'edge-1'],
    'rule-topic': ['default/test-1', 'default/test-1', 'edge-1'],
    'rule-wildcards': ['default/a/+/b/#', 'default/a/x/b', 'edge-1'],
    'bad-rule': ['default/#/a', '$SYS/broker/load', 'Edge_1'],
}.items():
    write('topic', name, '\n'.join(lines))

total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
print(f'{sum(len(fs) for _, _, fs in os.walk(out))} seeds, {total} bytes in {out}')
