package io.pgfence;

/**
 * Runs the application's callbacks (kept leases' listeners, observers, an elector's callbacks) on
 * the client's threads. One that throws, an Error too but the JVM's own, fails on its own: the
 * client's work on that thread goes on (the next loss told, a lost set's other leases released).
 */
final class Callbacks {
  private Callbacks() {}

  static void run(Runnable callback) {
    try {
      callback.run();
    } catch (VirtualMachineError fatal) {
      throw fatal;
    } catch (Throwable ignored) {
      // The application's failure, which its callback had to handle.
    }
  }
}
