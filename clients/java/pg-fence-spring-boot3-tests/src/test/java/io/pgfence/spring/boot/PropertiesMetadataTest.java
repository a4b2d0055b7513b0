package io.pgfence.spring.boot;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import java.io.IOException;
import java.io.InputStream;
import java.net.URL;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collections;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * The configuration metadata the starter's jar carries (what an IDE completes {@code pgfence.*}
 * from): every property the README's table documents, each with a description, and no other.
 */
class PropertiesMetadataTest {
  private static final Pattern PROPERTY =
      Pattern.compile("\\{[^{}]*\"name\"\\s*:\\s*\"(pgfence\\.[^\"]+)\"[^{}]*}");
  private static final Pattern DESCRIPTION =
      Pattern.compile("\"description\"\\s*:\\s*\"([^\"]+)\"");
  private static final Pattern README_ROW = Pattern.compile("(?m)^\\| `(pgfence\\.[a-z.-]+)` \\|");

  @Test
  void theMetadataDescribesEveryDocumentedProperty() throws IOException {
    String metadata = pgFenceMetadata();
    assertNotNull(
        metadata, "no META-INF/spring-configuration-metadata.json names the pgfence group");
    Map<String, String> described = new TreeMap<>();
    // The properties, not the groups before them, which have names too.
    Matcher property = PROPERTY.matcher(metadata.substring(metadata.indexOf("\"properties\"")));
    while (property.find()) {
      Matcher description = DESCRIPTION.matcher(property.group());
      described.put(property.group(1), description.find() ? description.group(1) : "");
    }
    // Run from pg-fence-spring-boot3-tests or pg-fence-spring-boot4-tests: the README is beside.
    String readme = Files.readString(Path.of("..", "README.md"));
    // The table whose header is "| property | default | what |", to its first blank line.
    int table = readme.indexOf("| property | default | what |");
    assertFalse(table < 0, "the README's table of pgfence.* properties was not found");
    readme = readme.substring(table, readme.indexOf("\n\n", table));
    TreeSet<String> documented = new TreeSet<>();
    Matcher row = README_ROW.matcher(readme);
    while (row.find()) {
      documented.add(row.group(1));
    }
    assertEquals(documented, described.keySet(), "the README's properties, and the metadata's");
    described.forEach(
        (name, description) -> assertFalse(description.isBlank(), name + " has no description"));
  }

  private static String pgFenceMetadata() throws IOException {
    ClassLoader loader = PropertiesMetadataTest.class.getClassLoader();
    for (URL url :
        Collections.list(loader.getResources("META-INF/spring-configuration-metadata.json"))) {
      try (InputStream in = url.openStream()) {
        String text = new String(in.readAllBytes(), StandardCharsets.UTF_8);
        if (text.contains("\"pgfence\"")) {
          return text;
        }
      }
    }
    return null;
  }
}
