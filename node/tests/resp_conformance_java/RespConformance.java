// The CL.THROTTLE conformance sequence (resp_conformance.py prints it as JSON on stdin) replayed
// through Redisson against redis-server with the redis-cell module and against floodgate's Redis
// front, replies compared as the Python client compares them: limited, limit and remaining
// exactly (remaining within what a fast limit earns over the step's own timing), retry_after and
// reset_after within one second, errors word for word.
//
// Redisson's RRateLimiter is its own Lua script, so CL.THROTTLE goes through Redisson's command
// executor as a custom RedisCommand: Redisson's connection pool, handshake (HELLO 3 for RESP3,
// CLIENT SETNAME), encoder, decoder and batches, with nothing of ours on the wire.
//
// Usage: java -cp CLASSES:JARS/* RespConformance REDIS_PORT FLOODGATE_PORT < sequence.json.
// Prints one line per step and exits 1 on any difference.

import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import org.redisson.Redisson;
import org.redisson.api.BatchOptions;
import org.redisson.api.RFuture;
import org.redisson.api.RedissonClient;
import org.redisson.client.RedisException;
import org.redisson.client.codec.StringCodec;
import org.redisson.client.protocol.RedisCommand;
import org.redisson.client.protocol.decoder.ObjectListReplayDecoder;
import org.redisson.command.CommandAsyncExecutor;
import org.redisson.command.CommandBatchService;
import org.redisson.config.Config;
import org.redisson.config.Protocol;

public final class RespConformance {
    private static int differences = 0;

    /** A call's integers, or its error's text. */
    private record Reply(List<Long> ints, String error) {
        @Override
        public String toString() {
            return error != null ? "error: " + error : ints.toString();
        }
    }

    private static RedissonClient connect(String port, Protocol protocol) {
        Config config = new Config();
        config.setProtocol(protocol);
        config.useSingleServer()
                .setAddress("redis://127.0.0.1:" + port)
                .setClientName("floodgate-conformance")
                .setConnectionMinimumIdleSize(1)
                .setConnectionPoolSize(2)
                .setTimeout(10_000)
                // Redisson retries a failed call; an error reply must reach the comparison once.
                .setRetryAttempts(0);
        return Redisson.create(config);
    }

    private static CommandAsyncExecutor executor(RedissonClient client) {
        return ((Redisson) client).getCommandExecutor();
    }

    /** The command under the name the sequence spells it with (cl.throttle or CL.THROTTLE). */
    private static RedisCommand<List<Object>> command(String name) {
        return new RedisCommand<>(name, new ObjectListReplayDecoder<>());
    }

    private static RFuture<List<Object>> send(CommandAsyncExecutor executor, List<Object> args) {
        String key = String.valueOf(args.get(1));
        Object[] params = args.subList(1, args.size()).toArray();
        return executor.writeAsync(key, StringCodec.INSTANCE, command((String) args.get(0)), params);
    }

    private static Reply read(CompletableFuture<List<Object>> future) {
        try {
            List<Long> ints = new ArrayList<>();
            for (Object value : future.join()) {
                ints.add(((Number) value).longValue());
            }
            return new Reply(ints, null);
        } catch (Exception e) {
            Throwable cause = e.getCause() != null ? e.getCause() : e;
            if (!(cause instanceof RedisException)) {
                throw new IllegalStateException("not a reply: " + cause, cause);
            }
            return new Reply(null, serverText(cause.getMessage()));
        }
    }

    /** Redisson appends ". channel: [...] command: ..." (ports, ids) to the server's text. */
    private static String serverText(String message) {
        int at = message.indexOf(". channel: ");
        return at < 0 ? message : message.substring(0, at);
    }

    /**
     * The tokens the call's limit earns in {@code seconds} (0 without a limit): how far remaining
     * may differ between two servers whose clocks were read up to that far apart relative to the
     * key's previous call. Within a hundredth of a token it is none, so slow limits compare exactly.
     */
    private static long drift(List<Object> args, double seconds) {
        if (args.size() < 5 || !(args.get(3) instanceof Number count) || !(args.get(4) instanceof Number period)) {
            return 0;
        }
        if (count.doubleValue() <= 0 || period.doubleValue() <= 0) {
            return 0;
        }
        double tokens = seconds * count.doubleValue() / period.doubleValue();
        return tokens < 0.01 ? 0 : (long) Math.ceil(tokens);
    }

    private static boolean same(Reply expected, Reply got, long tolerance) {
        if (expected.error != null || got.error != null) {
            return expected.error != null && expected.error.equals(got.error);
        }
        if (expected.ints.size() != got.ints.size() || expected.ints.size() < 3) {
            return false;
        }
        for (int i = 0; i < expected.ints.size(); i++) {
            long e = expected.ints.get(i), g = got.ints.get(i);
            if (i < 2 && e != g) {
                return false;
            }
            if (i == 2 && Math.abs(e - g) > tolerance) {
                return false;
            }
            if (i >= 3 && ((e == -1) != (g == -1) || Math.abs(e - g) > 1)) {
                return false;
            }
        }
        return true;
    }

    private static void compare(String what, Reply expected, Reply got, long tolerance) {
        boolean ok = same(expected, got, tolerance);
        if (!ok) {
            differences++;
        }
        System.out.printf("%s %s: redis-cell %s floodgate %s%n", ok ? "ok  " : "DIFF", what, expected, got);
    }

    /** Twelve calls on three keys in one Redisson batch (one write, replies in order). */
    private static List<Reply> pipelined(RedissonClient client, String prefix) {
        CommandBatchService batch = new CommandBatchService(executor(client), BatchOptions.defaults());
        List<RFuture<List<Object>>> futures = new ArrayList<>();
        for (int i = 0; i < 12; i++) {
            futures.add(send(batch, List.of("CL.THROTTLE", prefix + (i % 3), 2, 1, 3600)));
        }
        try {
            batch.execute();
        } catch (RedisException e) {
            // An error among the replies fails the batch; each future still holds its own.
        }
        List<Reply> replies = new ArrayList<>();
        for (RFuture<List<Object>> future : futures) {
            replies.add(read(future.toCompletableFuture()));
        }
        return replies;
    }

    public static void main(String[] argv) throws Exception {
        if (argv.length != 2) {
            System.err.println("usage: RespConformance REDIS_PORT FLOODGATE_PORT < sequence.json");
            System.exit(2);
        }
        @SuppressWarnings("unchecked")
        List<List<Object>> sequence = new ObjectMapper().readValue(System.in, List.class);
        for (Protocol protocol : new Protocol[] {Protocol.RESP3, Protocol.RESP2}) {
            RedissonClient cell = connect(argv[0], protocol), gate = connect(argv[1], protocol);
            // Each protocol on keys of its own, so the second pass starts from fresh buckets too.
            String prefix = protocol.name().toLowerCase() + ":";
            // Per key, how long its previous step took: both servers read their clocks within it.
            Map<Object, Double> took = new HashMap<>();
            for (int step = 0; step < sequence.size(); step++) {
                List<Object> args = new ArrayList<>(sequence.get(step));
                args.set(1, prefix + args.get(1));
                long start = System.nanoTime();
                Reply expected = read(send(executor(cell), args).toCompletableFuture());
                Reply got = read(send(executor(gate), args).toCompletableFuture());
                double elapsed = (System.nanoTime() - start) / 1e9;
                long tolerance = drift(args, elapsed + took.getOrDefault(args.get(1), 0.0));
                took.put(args.get(1), elapsed);
                compare(String.format("%s %2d %s", protocol, step, args), expected, got, tolerance);
            }
            List<Reply> expected = pipelined(cell, "piped:" + prefix), got = pipelined(gate, "piped:" + prefix);
            for (int i = 0; i < expected.size(); i++) {
                compare(protocol + " pipelined " + i, expected.get(i), got.get(i), 0);
            }
            cell.shutdown();
            gate.shutdown();
        }
        System.out.printf("%d differences%n", differences);
        System.exit(differences > 0 ? 1 : 0);
    }
}
