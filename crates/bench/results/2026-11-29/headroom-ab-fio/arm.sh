# usage: arm.sh NAME BGWEIGHT FGWEIGHT CAP_BPS(0=none) [BG=1]
N=$1; BW=$2; FW=$3; CAP=$4; BG=${5:-1}
C=/sys/fs/cgroup/blkio/capx
echo $BW > $C/bg/blkio.bfq.weight; echo $FW > $C/fg/blkio.bfq.weight
if [ "$CAP" = 0 ]; then echo "7:0 0" > $C/bg/blkio.throttle.read_bps_device; else echo "7:0 $CAP" > $C/bg/blkio.throttle.read_bps_device; fi
if [ "$BG" = 1 ]; then
sh -c "echo \$\$ > $C/bg/cgroup.procs; exec fio --name=bg --filename=/dev/loop0 --rw=read --bs=1M --iodepth=32 --ioengine=libaio --direct=1 --size=1G --time_based --runtime=24 --output-format=json --output=/tmp/capx/$N-bg.json" &
BGP=$!
sleep 3
fi
sh -c "echo \$\$ > $C/fg/cgroup.procs; exec fio --name=fg --filename=/dev/loop0 --rw=randread --bs=1M --iodepth=1 --ioengine=psync --direct=1 --offset=1G --size=1G --thinktime=60000 --time_based --runtime=18 --output-format=json --output=/tmp/capx/$N-fg.json"
[ "$BG" = 1 ] && wait $BGP
python3 - $N <<'P'
import json,sys
n=sys.argv[1]
f=json.load(open(f"/tmp/capx/{n}-fg.json"))['jobs'][0]['read']
c=f['clat_ns']; p=c['percentile']
s=f"{n:12s} fg n={f['total_ios']} mean={c['mean']/1e6:.2f} p50={p['50.000000']/1e6:.2f} p99={p['99.000000']/1e6:.2f} max={c['max']/1e6:.2f} ms"
try:
  b=json.load(open(f"/tmp/capx/{n}-bg.json"))['jobs'][0]['read']; s+=f"  bg={b['bw_bytes']/2**20:.1f} MiB/s"
except Exception: pass
print(s)
P
