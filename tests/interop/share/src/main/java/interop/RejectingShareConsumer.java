package interop;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * A member of a share group (KIP-932) that rejects the records it cannot handle: the broker writes
 * its dead letter to the group's {@code errors.deadletterqueue.topic.name} (KIP-1191), which the test
 * configures on the group.
 *
 * <p>Arguments: bootstrap servers, topic, group. A record whose value starts with {@code fail} is
 * rejected ({@code AcknowledgeType.REJECT}); every other one is accepted. Prints {@code rejected
 * <offset>} and {@code accepted <offset>}. Runs until killed.
 */
public final class RejectingShareConsumer {
    public static void main(String[] args) {
        Properties config = new Properties();
        config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        config.put(ConsumerConfig.GROUP_ID_CONFIG, args[2]);
        config.put("share.acknowledgement.mode", "explicit");
        config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        try (var consumer = new KafkaShareConsumer<byte[], byte[]>(config)) {
            consumer.subscribe(List.of(args[1]));
            while (true) {
                for (var record : consumer.poll(Duration.ofMillis(500))) {
                    String value = record.value() == null ? "" : new String(record.value(), StandardCharsets.UTF_8);
                    boolean fails = value.startsWith("fail");
                    consumer.acknowledge(record, fails ? AcknowledgeType.REJECT : AcknowledgeType.ACCEPT);
                    System.out.println((fails ? "rejected " : "accepted ") + record.offset());
                }
                consumer.commitSync();
            }
        }
    }
}
