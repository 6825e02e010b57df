package interop;

import java.util.Collection;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.sink.SinkConnector;
import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.sink.SinkTask;

/**
 * The smallest sink connector: it accepts every record its converter could read and prints {@code
 * sank <topic> <partition> <offset>} (and {@code task started}, {@code task stopped}). The failures are the converter's: a worker configured with
 * JsonConverter cannot read a value that is not JSON, and with {@code errors.tolerance=all} and a
 * dead-letter topic the worker writes that record there (DeadLetterQueueReporter). Kafka's own file
 * sink is not published for 4.4 on Maven Central, hence this one.
 */
public final class AcceptingSink extends SinkConnector {
    private Map<String, String> config;

    @Override public String version() { return "1"; }
    @Override public void start(Map<String, String> props) { config = props; }
    @Override public Class<? extends Task> taskClass() { return Accepting.class; }
    @Override public List<Map<String, String>> taskConfigs(int maxTasks) { return List.of(config); }
    @Override public void stop() {}
    @Override public ConfigDef config() { return new ConfigDef(); }

    /** The task: prints each record it is given, and when it starts and stops. */
    public static final class Accepting extends SinkTask {
        @Override public String version() { return "1"; }
        @Override public void start(Map<String, String> props) { System.out.println("task started"); }
        @Override public void put(Collection<SinkRecord> records) {
            for (SinkRecord r : records) {
                System.out.println("sank " + r.topic() + " " + r.kafkaPartition() + " " + r.kafkaOffset());
            }
        }
        @Override public void stop() { System.out.println("task stopped"); }
    }
}
