package interop;

import java.net.ConnectException;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.LogAndContinueProcessingExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

/**
 * A Kafka Streams application with KIP-1034's dead-letter queue: a processing failure is handled by
 * LogAndContinueProcessingExceptionHandler, which, with {@code errors.dead.letter.queue.topic.name}
 * set, writes the failed record to that topic with its {@code __streams.errors.*} headers and goes on.
 *
 * <p>Arguments: bootstrap servers, input topic, output topic, application id, dead-letter topic, state
 * directory. A record whose value starts with {@code fail} fails with an IllegalStateException whose
 * cause is a ConnectException; the others go to the output topic. At least once, and offsets committed
 * only every minute: killed with -9, it reads its records again and writes their letters again.
 * Prints {@code ready} once running. Runs until killed.
 */
public final class StreamsDlq {
    public static void main(String[] args) throws InterruptedException {
        Properties config = new Properties();
        config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        config.put(StreamsConfig.APPLICATION_ID_CONFIG, args[3]);
        config.put(StreamsConfig.ERRORS_DEAD_LETTER_QUEUE_TOPIC_NAME_CONFIG, args[4]);
        config.put(StreamsConfig.PROCESSING_EXCEPTION_HANDLER_CLASS_CONFIG,
            LogAndContinueProcessingExceptionHandler.class.getName());
        config.put(StreamsConfig.STATE_DIR_CONFIG, args[5]);
        config.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 60_000);
        config.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args[1], Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
            .mapValues(value -> {
                String text = value == null ? "" : new String(value, StandardCharsets.UTF_8);
                if (text.startsWith("fail")) {
                    throw new IllegalStateException("could not handle " + text,
                        new ConnectException("payment service refused the connection"));
                }
                return value;
            })
            .to(args[2], Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));

        KafkaStreams streams = new KafkaStreams(builder.build(), config);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                System.out.println("ready");
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(streams::close));
        streams.start();
        new CountDownLatch(1).await();
    }
}
