package interop;

import java.net.ConnectException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.kafka.annotation.EnableKafka;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.annotation.RetryableTopic;
import org.springframework.kafka.config.ConcurrentKafkaListenerContainerFactory;
import org.springframework.kafka.core.ConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaAdmin;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.annotation.BackOff;

/**
 * Spring Kafka's non-blocking retries: a {@code @RetryableTopic} listener fails a record once on its
 * topic and once on the retry topic Spring made ({@code <topic>-retry}), then Spring writes it to
 * {@code <topic>-dlt}. Its letter carries the retry topic's headers too, the main topic's first.
 *
 * <p>Arguments: bootstrap servers, topic, group (as system properties {@code interop.*} for the
 * annotations). A record whose value starts with {@code fail} fails. Runs until killed.
 */
public final class SpringRetryableTopic {
    public static void main(String[] args) throws InterruptedException {
        System.setProperty("interop.bootstrap", args[0]);
        System.setProperty("interop.topic", args[1]);
        System.setProperty("interop.group", args[2]);
        var context = new AnnotationConfigApplicationContext(Config.class, Listener.class);
        Runtime.getRuntime().addShutdownHook(new Thread(context::close));
        System.out.println("ready");
        new CountDownLatch(1).await();
    }

    /** The beans a Spring Boot application would get from its auto-configuration. */
    @Configuration
    @EnableKafka
    public static class Config {
        private static String bootstrap() {
            return System.getProperty("interop.bootstrap");
        }

        @Bean
        public KafkaAdmin admin() {
            return new KafkaAdmin(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap()));
        }

        @Bean
        public ConsumerFactory<byte[], byte[]> consumerFactory() {
            return new DefaultKafkaConsumerFactory<>(Map.of(
                ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap(),
                ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest",
                ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class,
                ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class));
        }

        @Bean
        public KafkaTemplate<byte[], byte[]> kafkaTemplate() {
            return new KafkaTemplate<>(new DefaultKafkaProducerFactory<>(Map.of(
                ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap(),
                ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class,
                ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class)));
        }

        @Bean
        public ConcurrentKafkaListenerContainerFactory<byte[], byte[]> kafkaListenerContainerFactory(
                ConsumerFactory<byte[], byte[]> consumers) {
            var factory = new ConcurrentKafkaListenerContainerFactory<byte[], byte[]>();
            factory.setConsumerFactory(consumers);
            return factory;
        }
    }

    /** The listener: one retry on {@code <topic>-retry}, a tenth of a second later, then the DLT. */
    public static class Listener {
        @RetryableTopic(attempts = "2", backOff = @BackOff(delay = 100), numPartitions = "3",
            replicationFactor = "1")
        @KafkaListener(topics = "#{systemProperties['interop.topic']}",
            groupId = "#{systemProperties['interop.group']}")
        public void listen(ConsumerRecord<byte[], byte[]> record) {
            String value = record.value() == null ? "" : new String(record.value(), StandardCharsets.UTF_8);
            if (value.startsWith("fail")) {
                throw new IllegalStateException("could not handle " + value,
                    new ConnectException("payment service refused the connection"));
            }
            System.out.println("handled " + record.offset());
        }
    }
}
