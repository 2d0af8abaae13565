set -e
D=/tmp/capx
mountpoint -q $D/t || mount -t tmpfs -o size=3g tmpfs $D/t 2>/dev/null || { mkdir -p $D/t; mount -t tmpfs -o size=3g tmpfs $D/t; }
truncate -s 2G $D/t/image.raw
touch $D/export.img
qemu-storage-daemon --object throttle-group,id=tg0,x-bps-total=157286400,x-iops-total=1500 \
  --blockdev driver=file,node-name=file0,filename=$D/t/image.raw,aio=threads,cache.direct=off \
  --blockdev driver=throttle,node-name=thr0,throttle-group=tg0,file=file0 \
  --export type=fuse,id=exp0,node-name=thr0,mountpoint=$D/export.img,writable=off > $D/qsd.log 2>&1 &
echo $! > $D/qsd.pid
sleep 2
L=$(losetup --direct-io=on -r -f --show $D/export.img)
echo $L > $D/loop
B=$(basename $L)
echo bfq > /sys/block/$B/queue/scheduler
echo 4 > /sys/block/$B/queue/nr_requests
echo 128 > /sys/block/$B/queue/max_sectors_kb
echo 32 > /sys/block/$B/queue/iosched/timeout_sync
cat /sys/block/$B/dev
mkdir -p /sys/fs/cgroup/blkio/capx/bg /sys/fs/cgroup/blkio/capx/fg
