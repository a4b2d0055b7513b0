package io.pgfence.examples;

final class Placeholder {
  private Placeholder() {}
}
