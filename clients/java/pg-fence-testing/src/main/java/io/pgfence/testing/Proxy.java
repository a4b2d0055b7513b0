package io.pgfence.testing;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A TCP proxy in front of a server that can lose a reply: once armed with {@link
 * #dropReplyAfter(String)}, the first server reply to arrive after a client message containing
 * those bytes is not forwarded, and both connections are closed, as when a network fails after the
 * server committed. With {@link #dropEveryReply(boolean)} every reply to such a message is lost.
 */
public final class Proxy implements AutoCloseable {
  private final int serverPort;
  private final ServerSocket listener;
  private volatile byte[] dropAfter;
  private volatile boolean every;
  private final AtomicInteger dropped = new AtomicInteger();
  private final AtomicInteger generation = new AtomicInteger();
  private volatile int hungUpTo = -1;
  private volatile boolean orphan;
  private final java.util.List<Socket> orphans = new java.util.concurrent.CopyOnWriteArrayList<>();

  /**
   * A proxy on a free loopback port to the server on {@code serverPort}, passing everything.
   *
   * @param serverPort the server's loopback port
   * @throws IOException when no loopback port can be bound
   */
  public Proxy(int serverPort) throws IOException {
    this.serverPort = serverPort;
    this.listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
    Thread accept = new Thread(this::accept, "proxy-accept");
    accept.setDaemon(true);
    accept.start();
  }

  /**
   * The port to connect to instead of the server's.
   *
   * @return the proxy's loopback port
   */
  public int port() {
    return listener.getLocalPort();
  }

  /**
   * Loses the reply to the next client message that contains {@code marker}.
   *
   * @param marker text of the message (a function's name), matched as UTF-8 bytes
   */
  public void dropReplyAfter(String marker) {
    this.dropAfter = marker.getBytes(StandardCharsets.UTF_8);
  }

  /**
   * Keeps losing the replies to messages with the marker, not only the next one.
   *
   * @param every true to lose every such reply, false for the next one only
   */
  public void dropEveryReply(boolean every) {
    this.every = every;
  }

  /**
   * The connections open now stop carrying data either way, as across a dead route (no reset, no
   * answer); connections made later work.
   */
  public void hangExisting() {
    hungUpTo = generation.get() - 1;
  }

  /**
   * With a lost reply, close the client's side only: the server's session lives on, as across a
   * partition, until {@link #closeOrphans()}.
   *
   * @param orphan true to leave the server's side open, false to close both
   */
  public void orphan(boolean orphan) {
    this.orphan = orphan;
  }

  /** Closes the server sides left open by {@link #orphan(boolean)}. */
  public void closeOrphans() {
    orphans.forEach(Proxy::closeQuietly);
  }

  /**
   * How many replies were lost.
   *
   * @return the replies not forwarded since the proxy started
   */
  public int dropped() {
    return dropped.get();
  }

  private void accept() {
    while (!listener.isClosed()) {
      try {
        Socket client = listener.accept();
        Socket server = new Socket(InetAddress.getLoopbackAddress(), serverPort);
        boolean[] armed = {false};
        int made = generation.getAndIncrement();
        pump(client, server, armed, true, made);
        pump(server, client, armed, false, made);
      } catch (IOException e) {
        return;
      }
    }
  }

  private void pump(Socket from, Socket to, boolean[] armed, boolean upstream, int made) {
    Thread thread =
        new Thread(
            () -> {
              byte[] buffer = new byte[65536];
              // Not closed by a try-with-resources: closing a socket's stream closes the socket,
              // and an orphan's server side must stay open.
              try {
                InputStream in = from.getInputStream();
                OutputStream out = to.getOutputStream();
                int read;
                while ((read = in.read(buffer)) > 0) {
                  if (made <= hungUpTo) {
                    continue; // swallowed: the route is dead
                  }
                  byte[] marker = dropAfter;
                  if (upstream && marker != null && contains(buffer, read, marker)) {
                    if (!every) {
                      dropAfter = null;
                    }
                    synchronized (armed) {
                      armed[0] = true;
                    }
                  } else if (!upstream) {
                    synchronized (armed) {
                      if (armed[0]) {
                        dropped.incrementAndGet();
                        break;
                      }
                    }
                  }
                  out.write(buffer, 0, read);
                  out.flush();
                }
              } catch (IOException ignored) {
                // The other side closed.
              }
              boolean dropped;
              synchronized (armed) {
                dropped = armed[0];
              }
              Socket server = upstream ? to : from;
              Socket client = upstream ? from : to;
              closeQuietly(client);
              if (orphan && dropped) {
                orphans.add(server);
              } else {
                closeQuietly(server);
              }
            },
            upstream ? "proxy-up" : "proxy-down");
    thread.setDaemon(true);
    thread.start();
  }

  private static boolean contains(byte[] buffer, int length, byte[] marker) {
    outer:
    for (int i = 0; i + marker.length <= length; i++) {
      for (int j = 0; j < marker.length; j++) {
        if (buffer[i + j] != marker[j]) {
          continue outer;
        }
      }
      return true;
    }
    return false;
  }

  private static void closeQuietly(Socket socket) {
    try {
      socket.close();
    } catch (IOException ignored) {
      // Closed already.
    }
  }

  @Override
  public void close() throws IOException {
    listener.close();
  }
}
