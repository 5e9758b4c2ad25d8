import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.CreateTopicsResult;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;

/**
 * The tests' hands on a real broker: Kafka's own Java producer, consumer and admin client, driven by JSON.
 *
 * Usage: java -cp KAFKA_JARS:CLASSES KafkaTool BOOTSTRAP < commands.json > results.json
 * stdin holds a JSON array of commands ({"op": ..., ...}); stdout gets a JSON array with one result per
 * command, in order. Commands: createTopic, deleteTopics, describeTopics, alterConfigs, deleteRecords,
 * listOffsets, offsetsForTimes, produce, consume (each documented at its method). Keys, values and header
 * values are base64 strings, or null. A failing command ends the run with exit code 1 and the exception on
 * stderr.
 */
public final class KafkaTool {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final JsonNodeFactory F = JsonNodeFactory.instance;
    private static final Base64.Encoder B64 = Base64.getEncoder();
    private static final Base64.Decoder UNB64 = Base64.getDecoder();
    /** A consume that makes no progress for this long is a hang, not a slow machine. */
    private static final long STALL_MS = 120_000;

    private final String bootstrap;

    private KafkaTool(String bootstrap) {
        this.bootstrap = bootstrap;
    }

    public static void main(String[] args) throws Exception {
        PrintStream out = System.out;
        System.setOut(System.err);  // client logging never mixes with the results
        JsonNode commands = JSON.readTree(System.in);
        KafkaTool tool = new KafkaTool(args[0]);
        ArrayNode results = F.arrayNode();
        for (JsonNode cmd : commands) {
            results.add(tool.run(cmd));
        }
        out.println(JSON.writeValueAsString(results));
        out.flush();
    }

    private JsonNode run(JsonNode cmd) throws Exception {
        String op = cmd.get("op").asText();
        switch (op) {
            case "createTopic": return createTopic(cmd);
            case "deleteTopics": return deleteTopics(cmd);
            case "describeTopics": return describeTopics(cmd);
            case "alterConfigs": return alterConfigs(cmd);
            case "deleteRecords": return deleteRecords(cmd);
            case "listOffsets": return listOffsets(cmd);
            case "offsetsForTimes": return offsetsForTimes(cmd);
            case "produce": return produce(cmd);
            case "consume": return consume(cmd);
            default: throw new IllegalArgumentException("unknown op " + op);
        }
    }

    // ---- admin ----

    private Admin admin() {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        return Admin.create(p);
    }

    private static Map<String, String> strings(JsonNode obj) {
        Map<String, String> m = new HashMap<>();
        if (obj != null) {
            obj.fields().forEachRemaining(e -> m.put(e.getKey(), e.getValue().asText()));
        }
        return m;
    }

    private JsonNode createTopic(JsonNode cmd) throws Exception {
        String topic = cmd.get("topic").asText();
        NewTopic nt = new NewTopic(topic, cmd.path("partitions").asInt(1), (short) 1).configs(strings(cmd.get("configs")));
        try (Admin a = admin()) {
            CreateTopicsResult r = a.createTopics(List.of(nt));
            r.all().get();
            return F.objectNode().put("topicId", r.topicId(topic).get().toString());
        }
    }

    private JsonNode deleteTopics(JsonNode cmd) throws Exception {
        List<String> names = new ArrayList<>();
        cmd.get("topics").forEach(n -> names.add(n.asText()));
        try (Admin a = admin()) {
            a.deleteTopics(names).all().get();
        }
        return F.objectNode();
    }

    private JsonNode describeTopics(JsonNode cmd) throws Exception {
        List<String> names = new ArrayList<>();
        cmd.get("topics").forEach(n -> names.add(n.asText()));
        ObjectNode out = F.objectNode();
        try (Admin a = admin()) {
            for (Map.Entry<String, TopicDescription> e : a.describeTopics(names).allTopicNames().get().entrySet()) {
                out.set(e.getKey(), F.objectNode().put("topicId", e.getValue().topicId().toString())
                        .put("partitions", e.getValue().partitions().size()));
            }
        }
        return out;
    }

    private JsonNode alterConfigs(JsonNode cmd) throws Exception {
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, cmd.get("topic").asText());
        List<AlterConfigOp> ops = new ArrayList<>();
        strings(cmd.get("set")).forEach((k, v) -> ops.add(new AlterConfigOp(new ConfigEntry(k, v), AlterConfigOp.OpType.SET)));
        try (Admin a = admin()) {
            a.incrementalAlterConfigs(Map.of(res, ops)).all().get();
        }
        return F.objectNode();
    }

    private JsonNode deleteRecords(JsonNode cmd) throws Exception {
        String topic = cmd.get("topic").asText();
        Map<TopicPartition, RecordsToDelete> req = new HashMap<>();
        cmd.get("offsets").fields().forEachRemaining(e ->
                req.put(new TopicPartition(topic, Integer.parseInt(e.getKey())), RecordsToDelete.beforeOffset(e.getValue().asLong())));
        ObjectNode out = F.objectNode();
        try (Admin a = admin()) {
            for (Map.Entry<TopicPartition, ?> e : a.deleteRecords(req).lowWatermarks().entrySet()) {
                @SuppressWarnings("unchecked")
                org.apache.kafka.common.KafkaFuture<org.apache.kafka.clients.admin.DeletedRecords> f =
                        (org.apache.kafka.common.KafkaFuture<org.apache.kafka.clients.admin.DeletedRecords>) e.getValue();
                out.put(Integer.toString(e.getKey().partition()), f.get().lowWatermark());
            }
        }
        return out;
    }

    private static IsolationLevel isolation(JsonNode cmd) {
        return "read_committed".equals(cmd.path("isolation").asText("read_uncommitted"))
                ? IsolationLevel.READ_COMMITTED : IsolationLevel.READ_UNCOMMITTED;
    }

    private static OffsetSpec spec(JsonNode s) {
        if (s.isNumber()) {
            return OffsetSpec.forTimestamp(s.asLong());
        }
        switch (s.asText()) {
            case "earliest": return OffsetSpec.earliest();
            case "latest": return OffsetSpec.latest();
            case "maxTimestamp": return OffsetSpec.maxTimestamp();
            default: throw new IllegalArgumentException("unknown offset spec " + s);
        }
    }

    /** Admin ListOffsets: {"topic", "partitions": [..], "spec": "earliest"|"latest"|"maxTimestamp"|ms, "isolation"}. */
    private JsonNode listOffsets(JsonNode cmd) throws Exception {
        String topic = cmd.get("topic").asText();
        Map<TopicPartition, OffsetSpec> req = new HashMap<>();
        for (JsonNode p : cmd.get("partitions")) {
            req.put(new TopicPartition(topic, p.asInt()), spec(cmd.get("spec")));
        }
        ObjectNode out = F.objectNode();
        try (Admin a = admin()) {
            Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> r =
                    a.listOffsets(req, new ListOffsetsOptions(isolation(cmd))).all().get();
            r.forEach((tp, info) -> out.set(Integer.toString(tp.partition()),
                    F.objectNode().put("offset", info.offset()).put("timestamp", info.timestamp())));
        }
        return out;
    }

    // ---- consumer ----

    private KafkaConsumer<byte[], byte[]> consumer(JsonNode cmd) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation(cmd).toString().toLowerCase(java.util.Locale.ROOT));
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "20");  // a test reads to a known end: don't idle there
        p.putAll(strings(cmd.get("config")));
        return new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    private static List<TopicPartition> partitions(KafkaConsumer<?, ?> c, JsonNode cmd) {
        List<TopicPartition> tps = new ArrayList<>();
        String topic = cmd.get("topic").asText();
        if (cmd.has("partitions")) {
            cmd.get("partitions").forEach(p -> tps.add(new TopicPartition(topic, p.asInt())));
        } else {
            c.partitionsFor(topic).forEach(pi -> tps.add(new TopicPartition(topic, pi.partition())));
        }
        return tps;
    }

    /** offsetsForTimes: {"topic", "partitions"?, "timestamp": ms} -> {partition: {offset, timestamp} | null}. */
    private JsonNode offsetsForTimes(JsonNode cmd) {
        ObjectNode out = F.objectNode();
        try (KafkaConsumer<byte[], byte[]> c = consumer(cmd)) {
            Map<TopicPartition, Long> req = new HashMap<>();
            for (TopicPartition tp : partitions(c, cmd)) {
                req.put(tp, cmd.get("timestamp").asLong());
            }
            for (Map.Entry<TopicPartition, OffsetAndTimestamp> e : c.offsetsForTimes(req).entrySet()) {
                OffsetAndTimestamp v = e.getValue();
                out.set(Integer.toString(e.getKey().partition()),
                        v == null ? F.nullNode() : F.objectNode().put("offset", v.offset()).put("timestamp", v.timestamp()));
            }
        }
        return out;
    }

    private static JsonNode bytes(byte[] b) {
        return b == null ? F.nullNode() : F.textNode(B64.encodeToString(b));
    }

    /**
     * Every record of a topic from its log start to its end offset (the LSO under read_committed), as the
     * consumer returns them: {"topic", "partitions"?, "isolation"?, "config"?} -> [record, ...].
     */
    private JsonNode consume(JsonNode cmd) {
        ArrayNode out = F.arrayNode();
        try (KafkaConsumer<byte[], byte[]> c = consumer(cmd)) {
            List<TopicPartition> tps = partitions(c, cmd);
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps);
            long lastProgress = System.currentTimeMillis();
            while (true) {
                boolean done = true;
                for (TopicPartition tp : tps) {
                    done &= c.position(tp) >= end.get(tp);
                }
                if (done) {
                    break;
                }
                int n = 0;
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                    n++;
                    ObjectNode rec = out.addObject().put("topic", r.topic()).put("partition", r.partition())
                            .put("offset", r.offset()).put("timestamp", r.timestamp())
                            .put("timestampType", r.timestampType().name);
                    rec.set("key", bytes(r.key()));
                    rec.set("value", bytes(r.value()));
                    ArrayNode hs = rec.putArray("headers");
                    for (Header h : r.headers()) {
                        hs.addArray().add(h.key()).add(bytes(h.value()));
                    }
                    rec.put("leaderEpoch", r.leaderEpoch().orElse(-1));
                }
                if (n > 0) {
                    lastProgress = System.currentTimeMillis();
                } else if (System.currentTimeMillis() - lastProgress > STALL_MS) {
                    throw new IllegalStateException("no records for " + STALL_MS + " ms before the end offsets " + end);
                }
            }
        }
        return out;
    }

    // ---- producer ----

    private static byte[] unbytes(JsonNode n) {
        return n == null || n.isNull() ? null : UNB64.decode(n.asText());
    }

    private static ProducerRecord<byte[], byte[]> record(String topic, JsonNode r) {
        List<Header> headers = new ArrayList<>();
        for (JsonNode h : r.path("headers")) {
            headers.add(new RecordHeader(h.get(0).asText(), unbytes(h.get(1))));
        }
        Integer partition = r.hasNonNull("partition") ? r.get("partition").asInt() : null;
        Long ts = r.hasNonNull("timestamp") ? r.get("timestamp").asLong() : null;
        return new ProducerRecord<>(topic, partition, ts, unbytes(r.get("key")), unbytes(r.get("value")), headers);
    }

    private static byte[] formatted(JsonNode fmt, long i) {
        return fmt == null || fmt.isNull() ? null : String.format(fmt.asText(), i).getBytes(StandardCharsets.UTF_8);
    }

    /**
     * Kafka's producer: {"topic", "config": {producer configs}, "steps": [...]}. A step is {"send": record},
     * {"sendMany": {"count", "partition"?, "key": format|null, "value": format, "timestamp"?, "timestampStep"?}}
     * (formats get the record's index through String.format), {"flush": 1}, {"begin": 1}, {"commit": 1},
     * {"abort": 1} or {"leaveOpen": 1} (flush, then close at once: a graceful close would abort the open
     * transaction, a forced one leaves it open until transaction.timeout.ms; the last step); a transactional.id
     * in config calls initTransactions first. Returns each send's
     * {partition, offset, timestamp}, in order.
     */
    private JsonNode produce(JsonNode cmd) throws Exception {
        String topic = cmd.get("topic").asText();
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.putAll(strings(cmd.get("config")));
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        boolean leftOpen = false;
        try (KafkaProducer<byte[], byte[]> pr = new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
            if (p.containsKey(ProducerConfig.TRANSACTIONAL_ID_CONFIG)) {
                pr.initTransactions();
            }
            for (JsonNode step : cmd.get("steps")) {
                if (leftOpen) {
                    throw new IllegalArgumentException("leaveOpen must be the last produce step");
                }
                Iterator<String> names = step.fieldNames();
                String what = names.next();
                JsonNode arg = step.get(what);
                switch (what) {
                    case "send":
                        sent.add(pr.send(record(topic, arg)));
                        break;
                    case "sendMany":
                        long n = arg.get("count").asLong();
                        for (long i = 0; i < n; i++) {
                            Integer part = arg.hasNonNull("partition") ? arg.get("partition").asInt() : null;
                            Long ts = arg.hasNonNull("timestamp")
                                    ? arg.get("timestamp").asLong() + i * arg.path("timestampStep").asLong(0) : null;
                            sent.add(pr.send(new ProducerRecord<>(topic, part, ts, formatted(arg.get("key"), i),
                                    formatted(arg.get("value"), i))));
                        }
                        break;
                    case "flush": pr.flush(); break;
                    case "begin": pr.beginTransaction(); break;
                    case "commit": pr.commitTransaction(); break;
                    case "abort": pr.abortTransaction(); break;
                    case "leaveOpen": pr.flush(); pr.close(Duration.ZERO); leftOpen = true; break;
                    default: throw new IllegalArgumentException("unknown produce step " + what);
                }
            }
            if (!leftOpen) {
                pr.flush();
            }
        }
        ArrayNode out = F.arrayNode();
        for (Future<RecordMetadata> f : sent) {
            try {
                RecordMetadata m = f.get();
                out.addObject().put("partition", m.partition()).put("offset", m.offset()).put("timestamp", m.timestamp());
            } catch (java.util.concurrent.ExecutionException e) {
                if (!(e.getCause() instanceof org.apache.kafka.common.errors.TransactionAbortedException)) {
                    throw e;  // a refused send fails the run: a test must not go on with fewer records
                }
                out.addObject().put("error", "TransactionAbortedException");  // aborted before its flush
            }
        }
        return out;
    }
}
