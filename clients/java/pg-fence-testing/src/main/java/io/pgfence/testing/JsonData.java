package io.pgfence.testing;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small JSON reader for the language-neutral behaviour files (clients/behaviours/*.json): objects
 * become {@link LinkedHashMap}s, arrays {@link List}s, numbers {@link Double}s.
 */
public final class JsonData {
  private final String text;
  private int at;

  private JsonData(String text) {
    this.text = text;
  }

  /**
   * The parsed contents of the behaviours file {@code name} (as {@code keeper.json}).
   *
   * @param name the file's name under clients/behaviours
   * @return the file's top-level object
   * @throws IllegalStateException when the file cannot be read
   */
  public static Map<String, Object> behaviours(String name) {
    try {
      Path file = Cluster.root().resolve("clients/behaviours").resolve(name);
      return asMap(parse(Files.readString(file)));
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  /**
   * The value of a JSON text: a Map, List, String, Number, Boolean or null.
   *
   * @param text one JSON value, with white space around it at most
   * @return the value
   * @throws IllegalArgumentException with the offset, for text that is not JSON
   */
  public static Object parse(String text) {
    JsonData reader = new JsonData(text);
    Object value = reader.value();
    reader.space();
    if (reader.at != text.length()) {
      throw reader.error("trailing text");
    }
    return value;
  }

  /**
   * {@code value}, a JSON object.
   *
   * @param value a value {@link #parse} made of an object
   * @return the same value, typed as a map
   */
  @SuppressWarnings("unchecked")
  public static Map<String, Object> asMap(Object value) {
    return (Map<String, Object>) value;
  }

  /**
   * {@code value}, a JSON array.
   *
   * @param value a value {@link #parse} made of an array
   * @return the same value, typed as a list
   */
  @SuppressWarnings("unchecked")
  public static List<Object> asList(Object value) {
    return (List<Object>) value;
  }

  private Object value() {
    space();
    char c = text.charAt(at);
    switch (c) {
      case '{':
        return object();
      case '[':
        return array();
      case '"':
        return string();
      case 't':
        return literal("true", Boolean.TRUE);
      case 'f':
        return literal("false", Boolean.FALSE);
      case 'n':
        return literal("null", null);
      default:
        return number();
    }
  }

  private Map<String, Object> object() {
    Map<String, Object> object = new LinkedHashMap<>();
    at++;
    space();
    if (text.charAt(at) == '}') {
      at++;
      return object;
    }
    while (true) {
      space();
      String key = string();
      space();
      expect(':');
      object.put(key, value());
      space();
      if (text.charAt(at) == ',') {
        at++;
        continue;
      }
      expect('}');
      return object;
    }
  }

  private List<Object> array() {
    List<Object> array = new ArrayList<>();
    at++;
    space();
    if (text.charAt(at) == ']') {
      at++;
      return array;
    }
    while (true) {
      array.add(value());
      space();
      if (text.charAt(at) == ',') {
        at++;
        continue;
      }
      expect(']');
      return array;
    }
  }

  private String string() {
    expect('"');
    StringBuilder out = new StringBuilder();
    while (true) {
      char c = text.charAt(at++);
      if (c == '"') {
        return out.toString();
      }
      if (c != '\\') {
        out.append(c);
        continue;
      }
      char escaped = text.charAt(at++);
      switch (escaped) {
        case 'n':
          out.append('\n');
          break;
        case 't':
          out.append('\t');
          break;
        case 'r':
          out.append('\r');
          break;
        case 'b':
          out.append('\b');
          break;
        case 'f':
          out.append('\f');
          break;
        case 'u':
          out.append((char) Integer.parseInt(text.substring(at, at + 4), 16));
          at += 4;
          break;
        default:
          out.append(escaped);
      }
    }
  }

  private Double number() {
    int start = at;
    while (at < text.length() && "+-0123456789.eE".indexOf(text.charAt(at)) >= 0) {
      at++;
    }
    if (start == at) {
      throw error("unexpected character");
    }
    return Double.valueOf(text.substring(start, at));
  }

  private Object literal(String word, Object value) {
    if (!text.startsWith(word, at)) {
      throw error("expected " + word);
    }
    at += word.length();
    return value;
  }

  private void expect(char c) {
    if (text.charAt(at) != c) {
      throw error("expected " + c);
    }
    at++;
  }

  private void space() {
    while (at < text.length() && Character.isWhitespace(text.charAt(at))) {
      at++;
    }
  }

  private IllegalArgumentException error(String what) {
    return new IllegalArgumentException(what + " at offset " + at);
  }
}
