package interop;

import java.net.ConnectException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.listener.ContainerProperties;
import org.springframework.kafka.listener.DeadLetterPublishingRecoverer;
import org.springframework.kafka.listener.DefaultErrorHandler;
import org.springframework.kafka.listener.KafkaMessageListenerContainer;
import org.springframework.kafka.listener.MessageListener;
import org.springframework.util.backoff.FixedBackOff;

/**
 * A Spring Kafka listener container as a team runs one: a DefaultErrorHandler tries a failing record
 * three times, then its DeadLetterPublishingRecoverer writes the letter to the default dead-letter
 * topic, {@code <topic>-dlt} (Spring Kafka 4; {@code .DLT} before), on the record's partition.
 *
 * <p>Arguments: bootstrap servers, topic, group. A record whose value starts with {@code fail} fails
 * with an IllegalStateException whose cause is a ConnectException. Prints {@code handled <offset>} for
 * each record handled and {@code ready} once it has its partitions. Runs until killed.
 */
public final class SpringDlt {
    public static void main(String[] args) throws InterruptedException {
        String bootstrap = args[0], topic = args[1], group = args[2];
        var consumers = new DefaultKafkaConsumerFactory<byte[], byte[]>(Map.of(
            ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap,
            ConsumerConfig.GROUP_ID_CONFIG, group,
            ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest",
            ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class,
            ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class));
        var producers = new DefaultKafkaProducerFactory<byte[], byte[]>(Map.of(
            ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap,
            ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class,
            ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class));
        var recoverer = new DeadLetterPublishingRecoverer(new KafkaTemplate<>(producers));
        var errors = new DefaultErrorHandler(recoverer, new FixedBackOff(0L, 2L));

        var properties = new ContainerProperties(topic);
        properties.setMessageListener((MessageListener<byte[], byte[]>) record -> {
            String value = record.value() == null ? "" : new String(record.value(), StandardCharsets.UTF_8);
            if (value.startsWith("fail")) {
                throw new IllegalStateException("could not handle " + value,
                    new ConnectException("payment service refused the connection"));
            }
            System.out.println("handled " + record.offset());
        });
        properties.setConsumerRebalanceListener(new org.apache.kafka.clients.consumer.ConsumerRebalanceListener() {
            public void onPartitionsRevoked(java.util.Collection<org.apache.kafka.common.TopicPartition> parts) {}
            public void onPartitionsAssigned(java.util.Collection<org.apache.kafka.common.TopicPartition> parts) {
                System.out.println("ready");
            }
        });
        var container = new KafkaMessageListenerContainer<>(consumers, properties);
        container.setCommonErrorHandler(errors);
        container.start();
        Runtime.getRuntime().addShutdownHook(new Thread(container::stop));
        new CountDownLatch(1).await();
    }
}
