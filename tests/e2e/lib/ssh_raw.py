"""ssh_raw.py: a bare SSH client transport (RFC 4253) for tests that must
send what no real client would: it does the key exchange the agent's
server offers (curve25519-sha256, ssh-ed25519 host keys, aes128-ctr with
hmac-sha2-256-etm@openssh.com, written here from the RFCs and OpenSSH's
PROTOCOL file with python3-cryptography) and
then sends and reads packets as the test builds them, without the client's
own manners (it answers nothing, reads only when asked).

RawSSH(host, port, timeout=30, rcvbuf=None)   version exchange and keys
    .packet(payload) -> bytes   one packet, encrypted, its sequence number taken
    .send(payload)              .packet() sent
    .recv() -> payload          the next packet
    .service("ssh-userauth")    SERVICE_REQUEST until SERVICE_ACCEPT
    .login(user, key_path) -> bool   public-key login with an ed25519 key file
                                (False when refused, or closed on instead)
    .exec(command, window) -> channel   a session channel opened with that
                                initial window, its command started
    .until_closed() -> (types, why)   the types of the packets read until the
                                server closed, and why: its DISCONNECT's
                                description, "" if it sent none, None if the
                                socket's timeout came first
    .sock                       the socket (settimeout, sendall, close)
ssh_string(b), u32(n)           the wire encodings, for building payloads
userauth(user, method, fields)  a USERAUTH_REQUEST payload for ssh-connection
"""
import hashlib
import hmac
import os
import socket
import struct

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

MSG_DISCONNECT, MSG_SERVICE_REQUEST, MSG_SERVICE_ACCEPT = 1, 5, 6
MSG_KEXINIT, MSG_NEWKEYS, MSG_KEX_ECDH_INIT, MSG_KEX_ECDH_REPLY = 20, 21, 30, 31
MSG_USERAUTH_REQUEST, MSG_USERAUTH_FAILURE, MSG_USERAUTH_SUCCESS = 50, 51, 52
MSG_GLOBAL_REQUEST = 80
MSG_CHANNEL_OPEN, MSG_CHANNEL_OPEN_CONFIRMATION, MSG_CHANNEL_REQUEST = 90, 91, 98


def u32(n):
    return struct.pack(">I", n)


def ssh_string(b):
    if isinstance(b, str):
        b = b.encode()
    return u32(len(b)) + b


def userauth(user, method, fields=b""):
    return bytes([MSG_USERAUTH_REQUEST]) + ssh_string(user) + ssh_string("ssh-connection") + ssh_string(method) + fields


def _name_list(*names):
    return ssh_string(",".join(names))


def _mpint(b):
    """An mpint from big-endian unsigned bytes (RFC 4251 5)."""
    b = b.lstrip(b"\0")
    if b and b[0] & 0x80:
        b = b"\0" + b
    return ssh_string(b)


class RawSSH:
    def __init__(self, host, port, timeout=30, rcvbuf=None):
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self._in = b""
        self._seq_out = self._seq_in = 0
        self._enc = self._dec = None
        self.version = b"SSH-2.0-gpurent_raw_test"
        self.sock.sendall(self.version + b"\r\n")
        self.server_version = self._line()
        self._key_exchange()

    def _line(self):
        while b"\n" not in self._in:
            data = self.sock.recv(4096)
            if not data:
                raise EOFError("closed before the server's version")
            self._in += data
        line, self._in = self._in.split(b"\n", 1)
        return line.rstrip(b"\r")

    def _read(self, n):
        while len(self._in) < n:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("closed")
            self._in += data
        out, self._in = self._in[:n], self._in[n:]
        return out

    def packet(self, payload):
        # Encrypt-then-MAC: the length goes in clear and the padding makes
        # what follows it whole blocks; the MAC covers the ciphertext.
        block, counted = (16, 1) if self._enc else (8, 5)
        pad = block - (counted + len(payload)) % block
        if pad < 4:
            pad += block
        length = u32(1 + len(payload) + pad)
        body = bytes([pad]) + payload + os.urandom(pad)
        if not self._enc:
            out = length + body
        else:
            sealed = length + self._enc.update(body)
            out = sealed + hmac.new(self._mac_out, u32(self._seq_out) + sealed, hashlib.sha256).digest()
        self._seq_out = (self._seq_out + 1) & 0xFFFFFFFF
        return out

    def send(self, payload):
        self.sock.sendall(self.packet(payload))

    def recv(self):
        if self._dec:
            head = self._read(4)
            sealed = head + self._read(struct.unpack(">I", head)[0])
            mac = self._read(32)
            want = hmac.new(self._mac_in, u32(self._seq_in) + sealed, hashlib.sha256).digest()
            assert hmac.compare_digest(mac, want), "the server's MAC does not verify"
            plain = head + self._dec.update(sealed[4:])
        else:
            head = self._read(5)
            plain = head + self._read(struct.unpack(">I", head[:4])[0] - 1)
        self._seq_in = (self._seq_in + 1) & 0xFFFFFFFF
        return plain[5:len(plain) - plain[4]]

    def _key_exchange(self):
        kexinit = (bytes([MSG_KEXINIT]) + os.urandom(16) + _name_list("curve25519-sha256") +
                   _name_list("ssh-ed25519") + _name_list("aes128-ctr") * 2 +
                   _name_list("hmac-sha2-256-etm@openssh.com") * 2 + _name_list("none") * 2 + _name_list() * 2 + b"\0" + u32(0))
        self.send(kexinit)
        server_kexinit = self.recv()
        assert server_kexinit[0] == MSG_KEXINIT, server_kexinit[0]
        mine = X25519PrivateKey.generate()
        q_c = mine.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.send(bytes([MSG_KEX_ECDH_INIT]) + ssh_string(q_c))
        reply = self.recv()
        assert reply[0] == MSG_KEX_ECDH_REPLY, reply[0]
        fields, at = [], 1
        for _ in range(2):  # the host key and the server's ephemeral key; its signature is not checked
            n = struct.unpack(">I", reply[at:at + 4])[0]
            fields.append(reply[at + 4:at + 4 + n])
            at += 4 + n
        host_key, q_s = fields
        k = _mpint(mine.exchange(X25519PublicKey.from_public_bytes(q_s)))
        h = hashlib.sha256(ssh_string(self.version) + ssh_string(self.server_version) + ssh_string(kexinit) +
                           ssh_string(server_kexinit) + ssh_string(host_key) + ssh_string(q_c) + ssh_string(q_s) +
                           k).digest()
        self.session_id = h

        def derive(letter, size):
            out = hashlib.sha256(k + h + letter + h).digest()
            while len(out) < size:
                out += hashlib.sha256(k + h + out).digest()
            return out[:size]

        self.send(bytes([MSG_NEWKEYS]))
        assert self.recv()[0] == MSG_NEWKEYS
        self._enc = Cipher(algorithms.AES(derive(b"C", 16)), modes.CTR(derive(b"A", 16))).encryptor()
        self._dec = Cipher(algorithms.AES(derive(b"D", 16)), modes.CTR(derive(b"B", 16))).decryptor()
        self._mac_out, self._mac_in = derive(b"E", 32), derive(b"F", 32)

    def service(self, name="ssh-userauth"):
        self.send(bytes([MSG_SERVICE_REQUEST]) + ssh_string(name))
        while True:
            p = self.recv()
            if p[0] == MSG_SERVICE_ACCEPT:
                return
            assert p[0] in (2, 4, 53), f"answered {p[0]} to a service request"  # ignore, debug, banner

    def _until(self, *types):
        """The next packet of one of types, skipping what a server may send
        unasked (ignore, debug, banner, global requests, window adjusts)."""
        while True:
            p = self.recv()
            if p[0] in types:
                return p
            assert p[0] in (2, 4, 53, 80, 93), f"unexpected message {p[0]}"

    def login(self, user, key_path):
        with open(key_path, "rb") as f:
            key = serialization.load_ssh_private_key(f.read(), None)
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        blob = ssh_string("ssh-ed25519") + ssh_string(raw)
        request = userauth(user, "publickey", b"\1" + ssh_string("ssh-ed25519") + ssh_string(blob))
        signature = key.sign(ssh_string(self.session_id) + request)
        self.send(request + ssh_string(ssh_string("ssh-ed25519") + ssh_string(signature)))
        return self._until(MSG_USERAUTH_SUCCESS, MSG_USERAUTH_FAILURE, MSG_DISCONNECT)[0] == MSG_USERAUTH_SUCCESS

    def exec(self, command, window=1 << 21):
        self.send(bytes([MSG_CHANNEL_OPEN]) + ssh_string("session") + u32(0) + u32(window) + u32(32768))
        reply = self._until(MSG_CHANNEL_OPEN_CONFIRMATION)
        channel = struct.unpack(">I", reply[5:9])[0]
        self.send(bytes([MSG_CHANNEL_REQUEST]) + u32(channel) + ssh_string("exec") + b"\0" + ssh_string(command))
        return channel

    def until_closed(self):
        types = []
        try:
            while True:
                p = self.recv()
                if p[0] == MSG_DISCONNECT:
                    n = struct.unpack(">I", p[5:9])[0]
                    return types, p[9:9 + n].decode()
                types.append(p[0])
        except (EOFError, ConnectionResetError):
            return types, ""
        except socket.timeout:
            return types, None
