// The CL.THROTTLE conformance sequence (resp_conformance.py prints it as JSON on stdin) replayed
// through go-redis against redis-server with the redis-cell module and against floodgate's Redis
// front, replies compared as the Python client compares them: limited, limit and remaining
// exactly (remaining within what a fast limit earns over the step's own timing), retry_after and
// reset_after within one second, errors word for word. go-redis speaks RESP3 (HELLO 3) by
// default, so this also covers floodgate's RESP3 replies against Redis's.
//
// Usage: go run . REDIS_PORT FLOODGATE_PORT < sequence.json. Prints one line per step and exits
// 1 on any difference.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

func connect(port string, protocol int) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:        "127.0.0.1:" + port,
		Protocol:    protocol,
		ReadTimeout: 10 * time.Second,
	})
}

// reply is a call's integers, or its error's text.
type reply struct {
	ints []int64
	err  string
}

func (r reply) String() string {
	if r.err != "" {
		return "error: " + r.err
	}
	return fmt.Sprint(r.ints)
}

func read(cmd *redis.Cmd) reply {
	ints, err := cmd.Int64Slice()
	if err != nil {
		return reply{err: err.Error()}
	}
	return reply{ints: ints}
}

// drift is the tokens the call's limit earns in `slack` (0 without a limit): how far remaining
// may differ between two servers whose clocks were read up to that far apart relative to the
// key's previous call. Within a hundredth of a token it is none, so slow limits compare exactly.
func drift(args []any, slack time.Duration) int64 {
	if len(args) < 5 {
		return 0
	}
	count, ok1 := args[3].(float64)
	period, ok2 := args[4].(float64)
	if !ok1 || !ok2 || count <= 0 || period <= 0 {
		return 0
	}
	tokens := slack.Seconds() * count / period
	if tokens < 0.01 {
		return 0
	}
	return int64(math.Ceil(tokens))
}

func same(expected, got reply, tolerance int64) bool {
	if expected.err != "" || got.err != "" {
		return expected.err == got.err
	}
	if len(expected.ints) != len(got.ints) || len(expected.ints) < 3 {
		return false
	}
	for i := range expected.ints {
		e, g := expected.ints[i], got.ints[i]
		if i < 2 && e != g {
			return false
		}
		if i == 2 && (e-g > tolerance || g-e > tolerance) {
			return false
		}
		diff := e - g
		if i >= 3 && ((e == -1) != (g == -1) || diff > 1 || diff < -1) {
			return false
		}
	}
	return true
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: resp-conformance-go REDIS_PORT FLOODGATE_PORT < sequence.json")
		os.Exit(2)
	}
	var sequence [][]any
	if err := json.NewDecoder(os.Stdin).Decode(&sequence); err != nil {
		fmt.Fprintln(os.Stderr, "reading the sequence:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	differences := 0
	for _, protocol := range []int{3, 2} {
		cell, gate := connect(os.Args[1], protocol), connect(os.Args[2], protocol)
		for _, client := range []*redis.Client{cell, gate} {
			if err := client.Ping(ctx).Err(); err != nil {
				fmt.Println("PING failed:", err)
				os.Exit(1)
			}
		}
		// Per key, how long its previous step took: both servers read their clocks within it.
		took := map[string]time.Duration{}
		// Each protocol on keys of its own, so the second pass starts from fresh buckets too.
		for step, args := range sequence {
			args := append([]any{}, args...)
			key := fmt.Sprintf("resp%d:%v", protocol, args[1])
			args[1] = key
			start := time.Now()
			expected, got := read(cell.Do(ctx, args...)), read(gate.Do(ctx, args...))
			elapsed := time.Since(start)
			ok := same(expected, got, drift(args, elapsed+took[key]))
			took[key] = elapsed
			if !ok {
				differences++
			}
			fmt.Printf("%s RESP%d %2d %v: redis-cell %v floodgate %v\n", mark(ok), protocol, step, args, expected, got)
		}
		// A pipeline of mixed calls, one round trip each.
		var piped [2][]reply
		for c, client := range []*redis.Client{cell, gate} {
			pipe := client.Pipeline()
			cmds := make([]*redis.Cmd, 12)
			for i := range cmds {
				cmds[i] = pipe.Do(ctx, "CL.THROTTLE", fmt.Sprintf("piped%d:%d", protocol, i%3), 2, 1, 3600)
			}
			_, _ = pipe.Exec(ctx)
			for _, cmd := range cmds {
				piped[c] = append(piped[c], read(cmd))
			}
		}
		for i := range piped[0] {
			ok := same(piped[0][i], piped[1][i], 0)
			if !ok {
				differences++
			}
			fmt.Printf("%s RESP%d pipelined %d: redis-cell %v floodgate %v\n", mark(ok), protocol, i, piped[0][i], piped[1][i])
		}
		_ = cell.Close()
		_ = gate.Close()
	}
	fmt.Printf("%d differences\n", differences)
	if differences > 0 {
		os.Exit(1)
	}
}

func mark(ok bool) string {
	if ok {
		return "ok  "
	}
	return "DIFF"
}
