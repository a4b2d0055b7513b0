package io.pgfence.examples.boot;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.scheduling.annotation.EnableScheduling;

/**
 * A Spring Boot application with the pg_fence starter and a scheduled job ({@link ReportJob}) that
 * runs on one instance at a time and whose writes are fenced. The same sources run on Boot 3 (with
 * pg-fence-spring-integration-6) and Boot 4 (with pg-fence-spring-integration): the starter picks
 * the lock registry of the Spring Integration line on the classpath.
 *
 * <pre>
 * java -jar app.jar --spring.datasource.url=jdbc:postgresql://db/app --report.instance=host-a
 * </pre>
 */
@SpringBootApplication
@EnableScheduling
public class FencedJobApplication {

  /** Boot makes it. */
  public FencedJobApplication() {}

  /**
   * Starts the application.
   *
   * @param args Spring Boot's arguments, e.g. {@code --report.every=10s}
   */
  public static void main(String[] args) {
    SpringApplication.run(FencedJobApplication.class, args);
  }
}
