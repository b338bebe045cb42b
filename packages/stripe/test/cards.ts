/**
 * A card payment as the tests confirm it: on the server, without redirect-based payment methods,
 * so Stripe asks no return_url (as the child worker's).
 */
export const CARD = {
  amount: 2000,
  currency: "usd",
  payment_method: "pm_card_visa",
  confirm: true,
  automatic_payment_methods: { enabled: true, allow_redirects: "never" },
} as const;
