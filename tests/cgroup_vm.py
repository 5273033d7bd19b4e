"""A real cgroup v2 hierarchy with the memory, pids and cpu controllers, for the
tests of the local backend's v2 code, on a host that binds them to cgroup v1.

The kernel binds each controller to one hierarchy at a time, and moves it to v2
only when its v1 hierarchy is gone from every mount namespace. Here the v1
hierarchies are mounted in the machine's root namespace (the memory one holds
the machine's own cgroups), so ``unshare -m`` then ``mount -t cgroup2`` gives a
hierarchy whose ``cgroup.controllers`` is ``hugetlb`` alone (writing ``+memory``,
``+pids`` or ``+cpu`` to its ``cgroup.subtree_control`` fails with ENOENT), and unmounting
``/sys/fs/cgroup/pids`` in the private namespace changes nothing (it is still
bound in the root one; /proc/cgroups keeps its v1 hierarchy id). Releasing it in
the root namespace would take the pids limit from every other test on the machine.

So the tests boot a kernel of their own: Debian's ``linux-image-amd64`` under
qemu, with this machine's root file system shared read-only over 9p (the same
venv, bwrap, worktree), cgroup2 mounted at /sys/fs/cgroup with every controller
enabled at its root (as systemd does), tmpfs on /tmp and /run, and a second,
writable 9p share that brings the command's files (a JUnit report) back. The shared
root becomes ``/`` by switch_root, not chroot: a chrooted process may not create a
user namespace, and bwrap needs one. When the command ends, sysrq powers the guest
off (and should init exit first, ``panic=-1`` with ``-no-reboot`` ends qemu as well).
qemu emulates the CPU (TCG): /dev/kvm exists here, but a guest under nested KVM
hangs before its first console line.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

QEMU = "qemu-system-x86_64"
BUSYBOX = Path("/bin/busybox")  # Debian busybox-static: the initramfs has no libc
GUEST_OUT = "/tmp/hrl-vm"  # where the writable share is mounted in the guest
# Load order (modprobe --show-depends): virtio transport, then 9p over it.
MODULES = (
    "drivers/virtio/virtio_ring",
    "drivers/virtio/virtio",
    "drivers/virtio/virtio_pci_modern_dev",
    "drivers/virtio/virtio_pci_legacy_dev",
    "drivers/virtio/virtio_pci",
    "fs/netfs/netfs",
    "fs/fscache/fscache",
    "net/9p/9pnet",
    "net/9p/9pnet_virtio",
    "fs/9p/9p",
)
_9P = "trans=virtio,version=9p2000.L,msize=524288"

# After switch_root: the command, its status, then power off (sysrq works whatever kernel.sysrq says).
_FINISH = f"/bin/sh {GUEST_OUT}/run.sh; echo $? > {GUEST_OUT}/rc; echo o > /proc/sysrq-trigger; sleep 30"
INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /host
mount -t proc proc /proc && mount -t sysfs sys /sys && mount -t devtmpfs dev /dev
while read -r m; do insmod "/mods/$m.ko" || echo "hrl-vm: insmod $m failed"; done < /mods/order
mount -t 9p -o {_9P},ro,cache=loose hostroot /host || echo "hrl-vm: cannot mount the host's root"
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t cgroup2 none /host/sys/fs/cgroup
echo "+memory +pids +cpu" > /host/sys/fs/cgroup/cgroup.subtree_control
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts pts /host/dev/pts
mount -t tmpfs shm /host/dev/shm
mount -t tmpfs tmp /host/tmp
mount -t tmpfs run /host/run
mkdir -p /host{GUEST_OUT} && mount -t 9p -o {_9P} out /host{GUEST_OUT} || echo "hrl-vm: cannot mount the out share"
ip link set lo up
exec switch_root /host /bin/sh -c '{_FINISH}'
"""


@dataclass(frozen=True)
class Kernel:
    image: Path
    modules: Path  # /lib/modules/<release>/kernel


def find_kernel(boot: Path = Path("/boot"), lib: Path = Path("/lib/modules")) -> Kernel | None:
    """The newest kernel in /boot whose 9p and virtio modules are installed."""
    for image in sorted(boot.glob("vmlinuz-*"), reverse=True):
        modules = lib / image.name.removeprefix("vmlinuz-") / "kernel"
        if all((modules / f"{m}.ko").is_file() for m in MODULES):
            return Kernel(image, modules)
    return None


def unavailable() -> str | None:
    """Why no VM can be booted here (scripts/setup installs what it needs), or None."""
    if shutil.which(QEMU) is None:
        return f"{QEMU} is not installed (Debian qemu-system-x86; scripts/setup)"
    if not _static_elf(BUSYBOX):
        return f"no statically linked {BUSYBOX} (Debian busybox-static; scripts/setup)"
    if find_kernel() is None:
        return "no kernel in /boot with its 9p and virtio modules (Debian linux-image-amd64; scripts/setup)"
    return None


def _static_elf(path: Path) -> bool:
    """An ELF64 executable with no program interpreter (PT_INTERP): it needs no libc."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if data[:5] != b"\x7fELF\x02":
        return False
    phoff, size, count = (int.from_bytes(data[a:b], "little") for a, b in ((0x20, 0x28), (0x36, 0x38), (0x38, 0x3A)))
    return all(int.from_bytes(data[phoff + i * size : phoff + i * size + 4], "little") != 3 for i in range(count))


def _cpio_entry(name: str, data: bytes, mode: int) -> bytes:
    """One entry of a newc cpio archive (the initramfs format), padded to 4 bytes."""
    fields = [0, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
    header = b"070701" + b"".join(f"{f:08X}".encode() for f in fields) + name.encode() + b"\0"
    header += b"\0" * (-len(header) % 4)
    return header + data + b"\0" * (-len(data) % 4)


def build_initrd(kernel: Kernel, dest: Path) -> Path:
    dirs = (0o040755, b"")
    entries = [("bin", *dirs), ("mods", *dirs)]
    entries.append(("init", 0o100755, INIT.encode()))
    entries.append(("bin/busybox", 0o100755, BUSYBOX.read_bytes()))
    order = "\n".join(Path(m).name for m in MODULES) + "\n"
    entries.append(("mods/order", 0o100644, order.encode()))
    for module in MODULES:
        entries.append((f"mods/{Path(module).name}.ko", 0o100644, (kernel.modules / f"{module}.ko").read_bytes()))
    archive = b"".join(_cpio_entry(name, data, mode) for name, mode, data in entries)
    archive += _cpio_entry("TRAILER!!!", b"", 0)
    dest.write_bytes(gzip.compress(archive, compresslevel=1))
    return dest


@dataclass(frozen=True)
class VmRun:
    rc: int | None  # the command's exit status; None when the guest never wrote it
    console: str


def run(script: str, out: Path, memory_mb: int = 2048, cpus: int = 2, timeout_s: float = 900) -> VmRun:
    """Boots the VM, runs ``script`` (sh, as root, in the host's file system) and powers off.
    ``out`` (a host directory) is the guest's GUEST_OUT: the script's files come back there."""
    kernel = find_kernel()
    if kernel is None or (why := unavailable()) is not None:
        raise RuntimeError(f"cannot boot the cgroup v2 VM: {why or 'no kernel'}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.sh").write_text(script)
    initrd = build_initrd(kernel, out / "initrd.gz")
    args = [
        QEMU,
        "-accel",
        "tcg,thread=multi",
        "-smp",
        str(cpus),
        "-m",
        str(memory_mb),
        "-nographic",
        "-no-reboot",
        "-kernel",
        str(kernel.image),
        "-initrd",
        str(initrd),
        "-append",
        "console=ttyS0 quiet panic=-1",
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        "-virtfs",
        f"local,path={out},mount_tag=out,security_model=none",
    ]
    console = out / "console.log"  # written as the guest runs: `tail -f` it to follow
    with console.open("w") as sink:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    rc_file = out / "rc"
    rc = int(rc_file.read_text()) if rc_file.is_file() else None
    return VmRun(rc=rc, console=console.read_text(errors="replace"))


def guest_env() -> dict[str, str]:
    """What the guest's command needs from this process's environment (chroot starts bare)."""
    keep = ("PATH", "HOME", "LANG", "HARNESSRL_HOME")
    return {k: os.environ[k] for k in keep if k in os.environ}
