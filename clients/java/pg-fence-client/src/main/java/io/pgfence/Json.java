package io.pgfence;

import java.lang.reflect.Array;
import java.util.Iterator;
import java.util.Map;

/**
 * The JSON text of the {@code changes} and {@code filter} of the fenced and versioned writes: maps
 * of column name to value. Strings, numbers, booleans, null, maps, iterables and arrays are written
 * as JSON; any other value as the JSON string of its {@code toString()} (a UUID, a date), which
 * PostgreSQL converts to the column's type as {@code jsonb_to_record} does.
 */
final class Json {
  private Json() {}

  static String of(Map<String, ?> object) {
    StringBuilder out = new StringBuilder();
    write(out, object);
    return out.toString();
  }

  private static void write(StringBuilder out, Object value) {
    if (value == null) {
      out.append("null");
    } else if (value instanceof Boolean) {
      out.append(value);
    } else if (value instanceof Number number) {
      writeNumber(out, number);
    } else if (value instanceof Map<?, ?> map) {
      out.append('{');
      boolean first = true;
      for (Map.Entry<?, ?> entry : map.entrySet()) {
        if (!first) {
          out.append(',');
        }
        first = false;
        writeString(out, String.valueOf(entry.getKey()));
        out.append(':');
        write(out, entry.getValue());
      }
      out.append('}');
    } else if (value instanceof Iterable<?> items) {
      writeItems(out, items.iterator());
    } else if (value.getClass().isArray()) {
      out.append('[');
      for (int i = 0; i < Array.getLength(value); i++) {
        if (i > 0) {
          out.append(',');
        }
        write(out, Array.get(value, i));
      }
      out.append(']');
    } else {
      writeString(out, value.toString());
    }
  }

  private static void writeItems(StringBuilder out, Iterator<?> items) {
    out.append('[');
    while (items.hasNext()) {
      write(out, items.next());
      if (items.hasNext()) {
        out.append(',');
      }
    }
    out.append(']');
  }

  private static void writeNumber(StringBuilder out, Number number) {
    if (number instanceof Double || number instanceof Float) {
      double d = number.doubleValue();
      if (Double.isNaN(d) || Double.isInfinite(d)) {
        throw new IllegalArgumentException("JSON has no " + d);
      }
    }
    if (number instanceof java.math.BigDecimal decimal) {
      out.append(decimal.toPlainString());
    } else {
      out.append(number);
    }
  }

  private static void writeString(StringBuilder out, String text) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"':
          out.append("\\\"");
          break;
        case '\\':
          out.append("\\\\");
          break;
        case '\n':
          out.append("\\n");
          break;
        case '\r':
          out.append("\\r");
          break;
        case '\t':
          out.append("\\t");
          break;
        default:
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
      }
    }
    out.append('"');
  }
}
