package io.pgfence.spring;

final class Placeholder {
  private Placeholder() {}
}
