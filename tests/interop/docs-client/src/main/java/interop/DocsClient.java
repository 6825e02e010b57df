package interop;

import static java.nio.charset.StandardCharsets.UTF_8;

import java.time.Duration;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Java example of docs/header-protocol.md, compiled as the docs show it: tests/interop/build.py
 * puts the document's code block where {@code DOCS_EXAMPLE} stands below (the block is kept in the
 * document only), so a change of the document that no longer compiles fails the build.
 *
 * <p>{@code produce <bootstrap> <topic> <key>=<value>...}: sends each record with Java's own
 * partitioner and prints {@code sent <key> <partition> <offset>}.
 * {@code consume <bootstrap> <topic> <group>}: reads the topic; a record whose value starts with
 * {@code fail} fails, and the example sends it to the retry topic {@code retry} (printing {@code
 * retried <partition> <offset>}); the others print {@code handled <partition> <offset>}. Runs until
 * killed.
 */
public final class DocsClient {
    public static void main(String[] args) throws Exception {
        Properties config = new Properties();
        config.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        config.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        config.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        try (var producer = new KafkaProducer<byte[], byte[]>(config)) {
            if (args[0].equals("produce")) {
                for (int i = 3; i < args.length; i++) {
                    String[] kv = args[i].split("=", 2);
                    var sent = producer.send(new ProducerRecord<>(args[2], kv[0].getBytes(UTF_8), kv[1].getBytes(UTF_8))).get();
                    System.out.println("sent " + kv[0] + " " + sent.partition() + " " + sent.offset());
                }
                return;
            }
            consume(producer, args[1], args[2], args[3]);
        }
    }

    private static void consume(KafkaProducer<byte[], byte[]> producer, String bootstrap, String topic, String group)
            throws Exception {
        Properties config = new Properties();
        config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        config.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        try (var consumer = new KafkaConsumer<byte[], byte[]>(config)) {
            consumer.subscribe(List.of(topic));
            while (true) {
                for (ConsumerRecord<byte[], byte[]> failed : consumer.poll(Duration.ofMillis(500))) {
                    try {
                        handle(failed);
                        System.out.println("handled " + failed.partition() + " " + failed.offset());
                    } catch (IllegalStateException e) {
                        retry(producer, failed, e);
                        producer.flush();
                        System.out.println("retried " + failed.partition() + " " + failed.offset());
                    }
                }
                consumer.commitSync();
            }
        }
    }

    private static void handle(ConsumerRecord<byte[], byte[]> record) {
        if (record.value() != null && new String(record.value(), UTF_8).startsWith("fail")) {
            throw new IllegalStateException("payment service timed out");
        }
    }

    private static void retry(KafkaProducer<byte[], byte[]> producer, ConsumerRecord<byte[], byte[]> failed, Exception e) {
        // DOCS_EXAMPLE
    }
}
