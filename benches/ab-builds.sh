#!/usr/bin/env bash
# A/B of two memnic builds on this machine, in one sitting: memif copy mode (our server rxonly
# <- our client txonly), memif with a zero-copy client, and MEMNIC both ways (host txonly ->
# guest rxonly, guest txonly -> host rxonly), at each size. Rounds alternate the builds run by
# run (A B B A ...), so both see the same mix of this machine's fast and slow states. Each run's
# samples are the receiver's 1-s Rx-pps lines (the first two and the last dropped); the table
# gives, per build, the 20th, 50th and 80th percentile of all samples (p80 is the fast state,
# p20 the slow one) and B/A at each.
#
#   benches/ab-builds.sh A_BIN B_BIN [--seconds N] [--rounds N] [--sizes "64 1518"] [--pairs "..."]
#   pairs: memif memif-zc memnic-h2g memnic-g2h tester (memnic-tester's `memnic` variant: one 1-s
#   trial per run, so its samples are 1-s windows too)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: ab-builds.sh A_BIN B_BIN [--seconds N] [--rounds N] [--sizes \"64 1518\"] [--pairs \"memif memif-zc memnic-h2g memnic-g2h\"]" >&2; exit 2; }
A=$(realpath "$1"); B=$(realpath "$2"); shift 2
T=6
ROUNDS=4
SIZES="64 1518"
PAIRS="memif memif-zc memnic-h2g memnic-g2h tester"
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) T=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --sizes) SIZES=$2; shift 2 ;;
        --pairs) PAIRS=$2; shift 2 ;;
        *) echo "ab-builds.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
done
DIR=$(mktemp -d)
SHM=memnic-ab-$$
# Every sample, "build pair size pps" (keep it with SAMPLES=FILE).
SAMPLES=${SAMPLES:-$DIR/samples}
trap 'pkill -INT -P $$ 2>/dev/null || true; rm -rf "$DIR"; rm -f /dev/shm/$SHM' EXIT

# run BIN PAIR SIZE -> appends the receiver's samples (pps) to stdout, one per line
run() {
    local bin=$1 pair=$2 size=$3 rx tx
    rm -f /dev/shm/$SHM "$DIR/sock"
    case $pair in
        tester)
            "$bin" tester --variant memnic --sizes "$size" --trials 1 --duration-ms 1000 --json 2>/dev/null |
                grep -o '"mpps": *[0-9.]*' | head -1 | awk -F: '{printf "%.0f\n", $2 * 1e6}' || true
            return 0 ;;
        memif|memif-zc)
            local zc=""; [ "$pair" = memif-zc ] && zc=",zero-copy=yes"
            timeout -s INT $((T + 8)) "$bin" testpmd -l 0 --vdev "memif0,role=server,socket=$DIR/sock" \
                --forward-mode=rxonly --stats-period 1 --duration $((T + 3)) >"$DIR/rx.log" 2>&1 &
            rx=$!
            sleep 0.5
            timeout -s INT $((T + 4)) "$bin" testpmd -l 1 --vdev "memif0,role=client,socket=$DIR/sock$zc" \
                --forward-mode=txonly --txpkts="$size" --stats-period 1 --duration "$T" >"$DIR/tx.log" 2>&1 || true
            wait $rx || true ;;
        memnic-h2g|memnic-g2h)
            local hm=txonly gm=rxonly log=guest
            [ "$pair" = memnic-g2h ] && hm=rxonly gm=txonly log=host
            timeout -s INT $((T + 8)) "$bin" testpmd -l 0 --vdev "memnic0,path=$SHM,role=host" \
                --forward-mode=$hm --txpkts="$size" --stats-period 1 --duration $((T + 3)) >"$DIR/host.log" 2>&1 &
            rx=$!
            sleep 0.5
            timeout -s INT $((T + 4)) "$bin" testpmd -l 1 --vdev "memnic0,path=$SHM,role=guest" \
                --forward-mode=$gm --txpkts="$size" --stats-period 1 --duration "$T" >"$DIR/guest.log" 2>&1 || true
            wait $rx || true
            cp "$DIR/$log.log" "$DIR/rx.log" ;;
    esac
    grep -a 'Rx-pps:' "$DIR/rx.log" | awk '$2>0{print $2}' | head -n -1 | tail -n +3 || true
}

for r in $(seq 1 "$ROUNDS"); do
    order="A B"; [ $((r % 2)) = 0 ] && order="B A"
    for pair in $PAIRS; do
        for size in $SIZES; do
            for v in $order; do
                bin=$A; [ "$v" = B ] && bin=$B
                run "$bin" "$pair" "$size" | sed "s/^/$v $pair $size /" >>"$SAMPLES" || true
                printf '.' >&2
            done
        done
    done
done
echo >&2

q() { # variant pair size quantile
    awk -v v="$1" -v p="$2" -v s="$3" '$1==v && $2==p && $3==s {print $4}' "$SAMPLES" | sort -n |
        awk -v q="$4" '{a[NR]=$1} END{ if (NR==0) {print 0; exit} i=int(q*(NR-1))+1; printf "%.3f\n", a[i]/1e6 }'
}
n() { awk -v v="$1" -v p="$2" -v s="$3" '$1==v && $2==p && $3==s' "$SAMPLES" | wc -l; }
echo "A = $A"
echo "B = $B"
echo "$ROUNDS rounds alternating A and B, ${T} s per run; Mpps at the 20th / 50th / 80th percentile of the receiver's 1-s samples"
printf '%-11s %5s | %-22s | %-22s | %-20s\n' pair size "A p20/p50/p80" "B p20/p50/p80" "B/A p20 p50 p80"
printf -- '------------------+------------------------+------------------------+---------------------\n'
for pair in $PAIRS; do
    for size in $SIZES; do
        a20=$(q A $pair $size 0.2); a50=$(q A $pair $size 0.5); a80=$(q A $pair $size 0.8)
        b20=$(q B $pair $size 0.2); b50=$(q B $pair $size 0.5); b80=$(q B $pair $size 0.8)
        ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a>0) printf "%.2f", b/a; else printf "-" }'; }
        printf '%-11s %5s | %6.2f %6.2f %6.2f n=%-2s| %6.2f %6.2f %6.2f n=%-2s| %5s %5s %5s\n' "$pair" "$size" \
            "$a20" "$a50" "$a80" "$(n A $pair $size)" "$b20" "$b50" "$b80" "$(n B $pair $size)" \
            "$(ratio $a20 $b20)" "$(ratio $a50 $b50)" "$(ratio $a80 $b80)"
    done
done

# The machine's two states, apart: a pair's samples (both builds) split at the geometric mean
# of their 10th and 90th percentiles when those differ by more than 1.6x (else one state).
# Per state: each build's median and sample count, and B/A of the medians.
echo
echo "Per state (samples split at sqrt(p10*p90) of both builds' samples; median Mpps, n):"
printf '%-11s %5s | %-30s | %-30s\n' pair size "slow: A  B  B/A" "fast: A  B  B/A"
printf -- '------------------+--------------------------------+-------------------------------\n'
for pair in $PAIRS; do
    for size in $SIZES; do
        awk -v p="$pair" -v s="$size" '$2==p && $3==s {print $1, $4}' "$SAMPLES" | sort -k2,2n | awk -v p="$pair" -v s="$size" '
            { v[NR]=$1; x[NR]=$2 }
            function med(arr, n,   i, j, t, k, y) {
                if (n == 0) return 0
                k = 0; for (i in arr) y[++k] = arr[i]
                for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (y[j] < y[i]) { t = y[i]; y[i] = y[j]; y[j] = t }
                return (n % 2) ? y[(n + 1) / 2] : (y[n / 2] + y[n / 2 + 1]) / 2
            }
            END {
                if (NR == 0) exit
                lo = x[int(0.1 * (NR - 1)) + 1]; hi = x[int(0.9 * (NR - 1)) + 1]
                cut = (lo > 0 && hi / lo > 1.6) ? sqrt(lo * hi) : hi + 1
                for (i = 1; i <= NR; i++) {
                    st = (x[i] >= cut) ? "fast" : "slow"
                    c[v[i] st]++; d[v[i] st, c[v[i] st]] = x[i]
                }
                line = sprintf("%-11s %5s |", p, s)
                for (k = 1; k <= 2; k++) {
                    st = (k == 1) ? "slow" : "fast"
                    delete A; delete B
                    for (i = 1; i <= c["A" st]; i++) A[i] = d["A" st, i]
                    for (i = 1; i <= c["B" st]; i++) B[i] = d["B" st, i]
                    ma = med(A, c["A" st]); mb = med(B, c["B" st])
                    r = (ma > 0 && mb > 0) ? sprintf("%.2f", mb / ma) : "-"
                    line = line sprintf(" %6.2f n=%-2d %6.2f n=%-2d %5s |", ma / 1e6, c["A" st], mb / 1e6, c["B" st], r)
                }
                print line
            }'
    done
done
