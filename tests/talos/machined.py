#!/usr/bin/env python3
"""A stand-in for Talos's machined on its machine API socket, for tests.

No Talos machine can run on the test host, so the node agent's Talos path
(src/effects/talos.rs) is tested against this: a real gRPC server (grpcio,
an implementation independent of ours: HTTP/2, gRPC framing, trailers and
status) serving the method paths and messages of tests/talos/machine.proto,
which follow Talos's published proto definitions field for field, and
answering as machined does (facts: ../shared/compat/talos.md):

- every call needs the `talos-role` metadata to grant one of the method's
  roles, else PERMISSION_DENIED "not authorized";
- MachineService/Reboot answers at once and then reboots the machine;
- MachineService/Upgrade (the old call) answers "Upgrade request received",
  then installs the image and reboots by itself (twice when staged);
- from release 1.13: ImageService/Pull streams progress and ends with the
  pinned name; LifecycleService/Upgrade installs only an image already
  pulled, streams the installer's lines and one exit code, and does not
  reboot. Before 1.13 these services do not exist (UNIMPLEMENTED). One
  install at a time: another meanwhile is refused FAILED_PRECONDITION
  "another installation/upgrade is already in progress"; an install runs on
  its call, so a caller that goes away cancels it (machined's
  internal/app/lifecycle/lifecycle.go runs the installer on the stream's
  context). --install-seconds makes an install take that long.

What a "reboot" or an "install" is here: the machine is the test's
simulated one (tests/support/machines.rs), so a reboot appends a line to
--reboot-marker (the fleet reboots the node on each line) and an install
writes the next OS image (`Talos (TAG)`, the tag of the image reference) to
--next-os-image, which the fleet reports as the node's osImage after its
next reboot. Each call is appended to --calls as one JSON object.

Usage: machined.py --socket PATH --release X.Y.Z --calls FILE
                   --reboot-marker FILE --next-os-image FILE [--fail-upgrade]
                   [--install-seconds N]
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from concurrent import futures

import grpc
from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))

# Roles each method accepts (machined's rules; a method not listed there
# needs os:admin).
ROLES = {
    "/machine.MachineService/Reboot": {"os:admin", "os:operator"},
    "/machine.MachineService/Upgrade": {"os:admin"},
    "/machine.ImageService/Pull": {"os:admin", "os:operator"},
    "/machine.LifecycleService/Upgrade": {"os:admin"},
}

# machined's own delay between answering and starting a reboot sequence is
# a goroutine's; a moment here lets the answer reach the caller first.
AFTER_ANSWER = 0.2


def generate():
    """Compile machine.proto with grpcio-tools into a temporary folder."""
    out = tempfile.mkdtemp(prefix="nk-machined-")
    rc = protoc.main(["protoc", f"-I{HERE}", f"--python_out={out}",
                      f"--grpc_python_out={out}", os.path.join(HERE, "machine.proto")])
    if rc != 0:
        sys.exit(f"machined: protoc failed ({rc})")
    sys.path.insert(0, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--release", required=True)
    ap.add_argument("--calls", required=True)
    ap.add_argument("--reboot-marker", required=True)
    ap.add_argument("--next-os-image", required=True)
    ap.add_argument("--fail-upgrade", action="store_true")
    ap.add_argument("--install-seconds", type=float, default=0)
    a = ap.parse_args()
    generate()
    import machine_pb2 as pb
    import machine_pb2_grpc as rpc

    release = tuple(int(x) for x in a.release.split(".")[:2])
    lock = threading.Lock()
    pulled = {}  # name or reference -> reference
    upgrading = threading.Lock()

    def record(method, ctx, request):
        roles = [v for k, v in ctx.invocation_metadata() if k == "talos-role"]
        with lock, open(a.calls, "a") as f:
            f.write(json.dumps({"method": method, "roles": roles, "request": request}) + "\n")
        if not set(roles) & ROLES[method]:
            ctx.abort(grpc.StatusCode.PERMISSION_DENIED, "not authorized")

    def later(f):
        threading.Timer(AFTER_ANSWER, f).start()

    def reboot_machine(times=1):
        with lock, open(a.reboot_marker, "a") as f:
            for _ in range(times):
                f.write("reboot\n")

    def install(reference):
        tag = reference.rsplit(":", 1)[-1] if ":" in reference.rsplit("/", 1)[-1] else "latest"
        with open(a.next_os_image + ".tmp", "w") as f:
            f.write(f"Talos ({tag})")
        os.replace(a.next_os_image + ".tmp", a.next_os_image)

    def instance(ctx, c, wrap=None):
        # ctrhelper: NS_UNKNOWN and CONTAINERD with NS_CRI are refused.
        if c.namespace not in (1, 2) or c.driver not in (0, 1) or (c.driver == 0 and c.namespace == 2):
            msg = f"invalid containerd instance: driver {c.driver}, namespace {c.namespace}"
            if wrap:
                ctx.abort(grpc.StatusCode.INTERNAL, f"{wrap}: {msg}")
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, msg)

    class Machine(rpc.MachineServiceServicer):
        def Reboot(self, req, ctx):
            record("/machine.MachineService/Reboot", ctx, {"mode": req.mode})
            if req.mode not in (0, 1, 2):
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown reboot mode {req.mode}")
            later(reboot_machine)
            return pb.RebootResponse(messages=[pb.Reboot(actor_id=str(uuid.uuid4()))])

        def Upgrade(self, req, ctx):
            record("/machine.MachineService/Upgrade", ctx, {
                "image": req.image, "preserve": req.preserve, "stage": req.stage,
                "force": req.force, "reboot_mode": req.reboot_mode})
            if not req.image:
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "image is required")
            if a.fail_upgrade:
                ctx.abort(grpc.StatusCode.UNKNOWN, f"failed to pull image {req.image!r}: not found")
            install(req.image)
            # Staged: a reboot into the installer, then one into the new image.
            later(lambda: reboot_machine(2 if req.stage else 1))
            return pb.UpgradeResponse(messages=[pb.Upgrade(ack="Upgrade request received",
                                                          actor_id=str(uuid.uuid4()))])

    class Image(rpc.ImageServiceServicer):
        def Pull(self, req, ctx):
            record("/machine.ImageService/Pull", ctx, {
                "containerd": {"driver": req.containerd.driver, "namespace": req.containerd.namespace},
                "image_ref": req.image_ref})
            instance(ctx, req.containerd)
            if not req.image_ref:
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "image_ref is required")
            digest = hashlib.sha256(req.image_ref.encode()).hexdigest()
            yield pb.ImageServicePullResponse(
                pull_progress=pb.ImageServicePullProgress(layer_id=f"sha256:{digest[:12]}"))
            name = f"{req.image_ref.rsplit(':', 1)[0]}@sha256:{digest}"
            pulled[name] = pulled[req.image_ref] = req.image_ref
            yield pb.ImageServicePullResponse(name=name)

    class Lifecycle(rpc.LifecycleServiceServicer):
        def Upgrade(self, req, ctx):
            record("/machine.LifecycleService/Upgrade", ctx, {
                "containerd": {"driver": req.containerd.driver, "namespace": req.containerd.namespace},
                "image_name": req.source.image_name})
            if not upgrading.acquire(blocking=False):
                ctx.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "another installation/upgrade is already in progress")
            try:
                instance(ctx, req.containerd, wrap="upgrade failed")
                name = req.source.image_name
                if not name:
                    ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "image name is required")
                if name not in pulled:
                    ctx.abort(grpc.StatusCode.INTERNAL,
                              f"upgrade failed: installer image {name!r} not found in containerd store")
                for line in ("running installer\n", f"installing {pulled[name]}\n"):
                    yield pb.LifecycleServiceUpgradeResponse(
                        progress=pb.LifecycleServiceInstallProgress(message=line))
                if a.fail_upgrade:
                    yield pb.LifecycleServiceUpgradeResponse(
                        progress=pb.LifecycleServiceInstallProgress(message="error: disk full\n"))
                    yield pb.LifecycleServiceUpgradeResponse(
                        progress=pb.LifecycleServiceInstallProgress(exit_code=1))
                    return
                until = time.monotonic() + a.install_seconds
                while time.monotonic() < until:
                    if not ctx.is_active():
                        print(f"install of {name} cancelled: its caller went away", flush=True)
                        return
                    time.sleep(0.1)
                install(pulled[name])
                print(f"installed {name}", flush=True)
                yield pb.LifecycleServiceUpgradeResponse(
                    progress=pb.LifecycleServiceInstallProgress(message="upgrade complete\n"))
                yield pb.LifecycleServiceUpgradeResponse(
                    progress=pb.LifecycleServiceInstallProgress(exit_code=0))
            finally:
                upgrading.release()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rpc.add_MachineServiceServicer_to_server(Machine(), server)
    if release >= (1, 13):
        rpc.add_ImageServiceServicer_to_server(Image(), server)
        rpc.add_LifecycleServiceServicer_to_server(Lifecycle(), server)
    if os.path.exists(a.socket):
        os.unlink(a.socket)
    server.add_insecure_port(f"unix:{a.socket}")
    server.start()
    print(f"machined stand-in {a.release} on {a.socket}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
