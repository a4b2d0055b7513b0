package io.pgfence.shedlock;

final class Placeholder {
  private Placeholder() {}
}
