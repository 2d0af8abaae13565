#!/usr/bin/env python3
"""Polls every child cgroup of a cgroup-v1 blkio parent (default: Docker's /sys/fs/cgroup/blkio/docker) every PERIOD
seconds and writes one line per child: time, short id, BFQ weight as read back from blkio.bfq.weight, bytes read on
device MAJ:MIN (blkio.bfq.io_service_bytes_recursive; `any`: every device's). Stops when killed.

    weight-timeline.py MAJ:MIN OUT [PERIOD] [PARENT]
"""
import os
import sys
import time


def main():
    dev, out_path = sys.argv[1], sys.argv[2]
    period = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
    parent = sys.argv[4] if len(sys.argv) > 4 else "/sys/fs/cgroup/blkio/docker"
    with open(out_path, "w", buffering=1) as out:
        out.write(f"# t0 {time.time()} dev {dev} parent {parent}\n")
        while True:
            now = time.time()
            try:
                children = os.listdir(parent)
            except FileNotFoundError:
                children = []
            for child in children:
                path = os.path.join(parent, child)
                try:
                    weight = open(os.path.join(path, "blkio.bfq.weight")).read().split()[-1]
                    read = 0
                    for line in open(os.path.join(path, "blkio.bfq.io_service_bytes_recursive")):
                        f = line.split()
                        if len(f) == 3 and dev in (f[0], "any") and f[1] == "Read":
                            read += int(f[2])
                except (OSError, IndexError):
                    continue
                out.write(f"{now:.3f} {child[:12]} w={weight} rb={read}\n")
            time.sleep(period)


if __name__ == "__main__":
    main()
